"""ListOps: nested list operations over digits, generated in-process as in the Long Range Arena.

ListOps (Nangia & Bowman 2018) asks for the value of a prefix expression such as
"[MAX 2 9 [MIN 4 7 ] 0 ]" (= 9): one of 10 classes, which depends on the whole tree. The Long
Range Arena (Tay et al., ICLR 2021) uses long versions: 500 to 2,000 tokens, trees at most 10
levels deep, at most 10 arguments per operator, 96k train / 2k valid / 2k test examples.

Operators (`OPERATORS`, written "[MAX", "[MIN", "[MED", "[SM" in the text): MAX, MIN; MED, the
median as LRA computes it, `int(np.median(args))` ("[MED 1 2 3 4 ]" = 2); SUM_MOD, the sum
modulo 10.

Trees follow LRA's generator (`lra_benchmarks/data/listops.py`): below `max_depth` an argument
is a nested operator with probability 0.25, else a uniform digit; an operator has a uniform
number of arguments in [2, max_args]. Whole expressions are drawn until one has between
`min_length` and `max_length` tokens (inclusive). Unlike LRA's files: no "( ... )" around each
application (`evaluate` skips them, so it reads LRA's files too), brackets are tokens, no
deduplication. Labels are skewed (MAX and MIN over many arguments drift to 9 and 0). Why each
difference, and the class balance: docs/data.md, "ListOps".

Pure numpy and Python: every call uses its own `np.random.default_rng(seed)`.
"""

from collections.abc import Iterator

import numpy as np

from tfjax import errors

OPERATORS = ("MAX", "MIN", "MED", "SUM_MOD")
OPERATOR_TOKENS = {"MAX": "[MAX", "MIN": "[MIN", "MED": "[MED", "SUM_MOD": "[SM"}
CLOSE = "]"
NUM_CLASSES = 10  # labels and digits are 0 .. 9

# LRA's settings (`lra_benchmarks/data/listops.py` flags).
MIN_LENGTH = 500
MAX_LENGTH = 2000
MAX_DEPTH = 10
MAX_ARGS = 10

BRANCH_PROB = 0.25  # LRA's VALUE_P: an argument above the last level is an operator this often
_SHORTEST = 4  # "[MAX 3 5 ]": the shortest expression
_MIN_ATTEMPTS = 20_000  # candidates drawn before a low acceptance rate counts as failure
_MAX_REJECTS_PER_EXAMPLE = 5_000  # ... and the rate (1 in 5,000) that does

_TOKEN_OPERATORS = {token: name for name, token in OPERATOR_TOKENS.items()}
_OPERATOR_TOKENS = tuple(OPERATOR_TOKENS[name] for name in OPERATORS)
_DIGITS = tuple(str(d) for d in range(NUM_CLASSES))
_PARENTHESES = ("(", ")")


def apply_operator(name: str, values: list[int]) -> int:
    """The value of operator `name` ("MAX", "MIN", "MED" or "SUM_MOD") on digits `values`."""
    if name == "MAX":
        return max(values)
    if name == "MIN":
        return min(values)
    if name == "SUM_MOD":
        return sum(values) % NUM_CLASSES
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    # int(np.median(...)) as in LRA: the mean of the two middle values, truncated (both >= 0).
    return (ordered[middle - 1] + ordered[middle]) // 2


def _uniforms(rng: np.random.Generator, block: int = 8192) -> Iterator[float]:
    """An endless stream of uniform floats in [0, 1), drawn from `rng` in blocks for speed."""
    while True:
        yield from rng.random(block).tolist()


def _draw(
    uniform: Iterator[float], max_depth: int, max_args: int, max_length: int
) -> list[str] | None:
    """The tokens of one expression from LRA's tree distribution; None once it exceeds max_length.

    No helper calls per token: this loop is the generator's whole cost, and the tests' runtime
    type checks wrap every function call.
    """
    tokens: list[str] = []
    args_left: list[int] = []  # per open operator, the arguments still to draw
    # Tokens the expression will have at least: those written, one per argument still to draw
    # and one "]" per open operator. Past max_length the draw stops early.
    at_least = 1
    while True:
        if tokens:
            args_left[-1] -= 1  # this node is an argument of the innermost open operator
        # The node sits at level len(args_left) + 1 (root = 1); the last level holds digits.
        # The root is always an operator: a bare digit is never long enough.
        if not tokens or (len(args_left) + 1 < max_depth and next(uniform) < BRANCH_PROB):
            num_args = 2 + int(next(uniform) * (max_args - 1))
            tokens.append(_OPERATOR_TOKENS[int(next(uniform) * len(OPERATORS))])
            args_left.append(num_args)
            at_least += num_args + 1  # one slot becomes "[OP", num_args slots and "]"
            if at_least > max_length:
                return None
            continue
        tokens.append(_DIGITS[int(next(uniform) * NUM_CLASSES)])
        while args_left[-1] == 0:
            args_left.pop()
            tokens.append(CLOSE)
            if not args_left:
                return tokens


def _longest(max_depth: int, max_args: int) -> int:
    """Tokens of the largest expression: every node above the last level has max_args arguments."""
    length = 1  # a digit on the last level
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _check_arguments(
    num_examples: int, min_length: int, max_length: int, max_depth: int, max_args: int
) -> None:
    if num_examples < 0:
        raise errors.ConfigError(f"num_examples must be >= 0, got {num_examples}.")
    if max_depth < 2:
        raise errors.ConfigError(
            f"max_depth must be >= 2 (level 1 is the root operator, the last level holds "
            f"digits), got {max_depth}: raise max_depth."
        )
    if max_args < 2:
        raise errors.ConfigError(f"max_args must be >= 2, got {max_args}: raise max_args.")
    if min_length > max_length:
        raise errors.ConfigError(
            f"Need min_length <= max_length, got min_length={min_length}, "
            f"max_length={max_length}: raise max_length or lower min_length."
        )
    if max_length < _SHORTEST:
        raise errors.ConfigError(
            f"max_length={max_length} is below the shortest expression ({_SHORTEST} tokens, "
            "e.g. '[MAX 3 5 ]'): raise max_length."
        )
    longest = _longest(max_depth, max_args)
    if min_length > longest:
        raise errors.ConfigError(
            f"min_length={min_length} exceeds the longest expression ({longest} tokens) with "
            f"max_depth={max_depth}, max_args={max_args}: lower min_length or raise max_depth "
            "or max_args."
        )


def generate(
    num_examples: int,
    *,
    seed: int,
    min_length: int = MIN_LENGTH,
    max_length: int = MAX_LENGTH,
    max_depth: int = MAX_DEPTH,
    max_args: int = MAX_ARGS,
) -> list[tuple[str, int]]:
    """Random ListOps expressions and their values (see the module docstring).

    Args:
        num_examples: number of examples (>= 0).
        seed: seeds `np.random.default_rng`; equal arguments give equal examples.
        min_length, max_length: inclusive bounds on the tokens per expression. The root is
            always an operator, so every expression has at least 4 tokens ("[MAX 3 5 ]").
        max_depth: levels of the tree, the root operator at level 1 and digits counted (LRA's
            convention): operators nest at most `max_depth - 1` deep, so 2 gives flat lists.
        max_args: most arguments per operator (>= 2); each has a uniform count in [2, max_args].

    Returns:
        `num_examples` (text, label) pairs: whitespace-separated tokens such as
        "[MAX 2 9 [MIN 4 7 ] 0 ]" and the expression's value in 0 .. 9.

    Raises:
        ValueError: for invalid arguments, and when fewer than 1 in 5,000 candidate expressions
            has a length in [min_length, max_length] (the settings rarely reach those lengths).
    """
    _check_arguments(num_examples, min_length, max_length, max_depth, max_args)
    uniform = _uniforms(np.random.default_rng(seed))
    examples: list[tuple[str, int]] = []
    attempts = 0
    while len(examples) < num_examples:
        attempts += 1
        tokens = _draw(uniform, max_depth, max_args, max_length)
        if tokens is not None and len(tokens) >= min_length:
            text = " ".join(tokens)
            examples.append((text, evaluate(text)))
        elif attempts >= _MIN_ATTEMPTS and attempts > _MAX_REJECTS_PER_EXAMPLE * (
            len(examples) + 1
        ):
            raise errors.ConfigError(
                f"Only {len(examples)} of {attempts} random expressions had {min_length} to "
                f"{max_length} tokens with max_depth={max_depth}, max_args={max_args}: these "
                "settings rarely reach those lengths. Lower min_length, raise max_length, or "
                "raise max_args (LRA uses 10) or max_depth."
            )
    return examples


def evaluate(text: str) -> int:
    """The value of a ListOps expression, e.g. 9 for "[MAX 2 9 [MIN 4 7 ] 0 ]".

    A stack-based parser, independent of the generator. LRA's parentheses "(" and ")" are
    skipped, so the lines of LRA's TSV files evaluate as well.

    Args:
        text: whitespace-separated tokens: "[MAX", "[MIN", "[MED", "[SM", "]" and digits.

    Returns:
        The value, in 0 .. 9.

    Raises:
        ValueError: for an unknown token, unbalanced brackets, an operator without arguments or
            anything after the end of the expression.
    """
    stack: list[tuple[str, list[int]]] = []
    result = None
    for token in text.split():
        if token in _PARENTHESES:
            continue
        if result is not None:
            raise ValueError(f"Token {token!r} after the end of the expression in {text!r}.")
        if token in _TOKEN_OPERATORS:
            stack.append((_TOKEN_OPERATORS[token], []))
            continue
        if token == CLOSE:
            if not stack or not stack[-1][1]:
                raise ValueError(f"Unmatched ']' or an operator without arguments in {text!r}.")
            name, values = stack.pop()
            value = apply_operator(name, values)
        elif token in _DIGITS:
            value = int(token)
        else:
            raise ValueError(f"Unknown token {token!r} in {text!r}.")
        if stack:
            stack[-1][1].append(value)
        else:
            result = value
    if stack or result is None:
        raise ValueError(f"Incomplete expression {text!r}: an operator lacks its ']'.")
    return result
