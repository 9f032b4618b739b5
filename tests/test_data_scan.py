"""Tests for tfjax/data/scan.py: the SCAN grammar, its interpretation and the standard splits."""

import collections

import pytest

from tfjax.data import scan

LT, RT = "I_TURN_LEFT", "I_TURN_RIGHT"


def _reference_interpret(command: str) -> list[str]:
    """A slow, obvious parser/interpreter of SCAN commands, written from the paper's rules."""
    if " after " in command:
        first, second = command.split(" after ")
        return _reference_interpret(second) + _reference_interpret(first)
    if " and " in command:
        first, second = command.split(" and ")
        return _reference_interpret(first) + _reference_interpret(second)
    words = command.split()
    if words[-1] in ("twice", "thrice"):
        return _reference_interpret(" ".join(words[:-1])) * (2 if words[-1] == "twice" else 3)
    verb = {"walk": ["I_WALK"], "look": ["I_LOOK"], "run": ["I_RUN"], "jump": ["I_JUMP"]}
    action = [] if words[0] == "turn" else verb[words[0]]
    if len(words) == 1:
        return action
    turn = {"left": [LT], "right": [RT]}[words[-1]]
    if len(words) == 2:
        return turn + action
    if words[1] == "opposite":
        return turn + turn + action
    assert words[1] == "around"
    return (turn + action) * 4


@pytest.fixture(scope="module")
def commands():
    return scan.generate()


def test_generate_counts(commands):
    assert len(commands) == 20_910
    assert len({command for command, _ in commands}) == 20_910
    assert max(len(actions.split()) for _, actions in commands) == 48
    assert min(len(actions.split()) for _, actions in commands) == 1


def test_generate_is_deterministic(commands):
    assert scan.generate() == commands


@pytest.mark.parametrize(
    ("command", "actions"),
    [
        ("jump", "I_JUMP"),
        ("turn left twice", "I_TURN_LEFT I_TURN_LEFT"),
        ("walk left", "I_TURN_LEFT I_WALK"),
        ("turn right", "I_TURN_RIGHT"),
        ("jump thrice", "I_JUMP I_JUMP I_JUMP"),
        ("turn opposite right twice", "I_TURN_RIGHT I_TURN_RIGHT I_TURN_RIGHT I_TURN_RIGHT"),
        ("turn around left", "I_TURN_LEFT I_TURN_LEFT I_TURN_LEFT I_TURN_LEFT"),
        (
            "run right thrice after look",
            "I_LOOK I_TURN_RIGHT I_RUN I_TURN_RIGHT I_RUN I_TURN_RIGHT I_RUN",
        ),
        (
            "jump opposite left and walk thrice",
            "I_TURN_LEFT I_TURN_LEFT I_JUMP I_WALK I_WALK I_WALK",
        ),
        (
            "jump opposite left after walk around left",
            "I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK I_TURN_LEFT I_WALK "
            "I_TURN_LEFT I_TURN_LEFT I_JUMP",
        ),
        (
            "jump opposite left after walk around right",
            "I_TURN_RIGHT I_WALK I_TURN_RIGHT I_WALK I_TURN_RIGHT I_WALK I_TURN_RIGHT I_WALK "
            "I_TURN_LEFT I_TURN_LEFT I_JUMP",
        ),
        (
            "look around right thrice and walk left",
            "I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK "
            "I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK "
            "I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK I_TURN_RIGHT I_LOOK "
            "I_TURN_LEFT I_WALK",
        ),
    ],
)
def test_literal_examples(commands, command, actions):
    assert dict(commands)[command] == actions


def test_every_command_matches_reference_interpreter(commands):
    for command, actions in commands:
        assert actions.split() == _reference_interpret(command), command


def test_ungrammatical_commands_are_absent(commands):
    table = dict(commands)
    for command in ("turn", "walk twice twice", "walk and run and look", "turn twice", "left"):
        assert command not in table


@pytest.mark.parametrize(
    ("name", "num_train", "num_test"),
    [("simple", 16_728, 4_182), ("length", 16_990, 3_920), ("addprim_jump", 14_670, 7_706)],
)
def test_split_sizes_match_published(name, num_train, num_test):
    data = scan.split(name)
    assert (len(data["train"]), len(data["test"])) == (num_train, num_test)


@pytest.mark.parametrize("name", scan.SPLITS)
def test_split_train_and_test_are_disjoint(commands, name):
    data = scan.split(name)
    train = {command for command, _ in data["train"]}
    test = {command for command, _ in data["test"]}
    assert not train & test
    assert train | test == {command for command, _ in commands}
    assert set(data["train"]) | set(data["test"]) <= set(commands)


def test_simple_split_depends_on_seed_only():
    assert scan.split("simple", seed=3) == scan.split("simple", seed=3)
    assert scan.split("simple", seed=3)["test"] != scan.split("simple", seed=4)["test"]


def test_length_split_by_number_of_actions():
    data = scan.split("length")
    assert max(len(actions.split()) for _, actions in data["train"]) == 22
    # No command has 23 actions, so the test set starts at 24 (paper, Section 3.2).
    assert min(len(actions.split()) for _, actions in data["test"]) == 24


def test_addprim_jump_split():
    data = scan.split("addprim_jump")
    train_counts = collections.Counter(command for command, _ in data["train"])
    assert train_counts["jump"] == 1_467
    assert train_counts["jump"] / len(data["train"]) == pytest.approx(0.10)
    assert ("jump", "I_JUMP") in data["train"]
    assert all(count == 1 for command, count in train_counts.items() if command != "jump")
    assert not any("jump" in command.split() for command in train_counts if command != "jump")
    assert all("jump" in command.split() for command, _ in data["test"])
    assert "jump" not in {command for command, _ in data["test"]}


def test_unknown_split_lists_names():
    with pytest.raises(ValueError, match="simple, length, addprim_jump"):
        scan.split("mcd1")
