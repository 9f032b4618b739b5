"""The masked-LM objective of BERT (Devlin et al. 2019, §3.1): masking inputs, loss on the masked.

Of each row's real tokens (segment id > 0, not a special id such as [CLS], [SEP] or padding),
`round(rate * n)` (at least one) are selected uniformly without replacement; of the selected,
80% become the mask token, 10% a token drawn uniformly from the vocabulary (as Hugging Face's
`DataCollatorForLanguageModeling`) and 10% stay as they are. The model sees the masked row and is
scored only on the selected positions: cross-entropy (with the run's label smoothing),
accuracy and perplexity of the original tokens there.

Masking runs inside the jitted step. Each row has its own key, `fold_in(key, row)` with `row` its
index in the global batch, so a batch is masked the same on one device or many; the train step
derives `key` from the run's dropout key and the step (`tfjax.training.steps`), so a run resumed
from a checkpoint masks exactly as the uninterrupted one. Evaluation keys each row by its
tokens, so an example gets the same masks in every evaluation whatever batch it lands in.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from tfjax import errors
from tfjax.nn import losses

MASK_FRACTION = 0.8  # of the selected tokens: the mask token (BERT §3.1)
RANDOM_FRACTION = 0.1  # a random token; the remaining 0.1 keep their token
TARGETS, WEIGHTS = "mlm_targets", "mlm_weights"  # batch fields the masked batch adds


@dataclasses.dataclass(frozen=True)
class Masking:
    """What masking needs from the tokenizer and the config.

    Attributes:
        mask_id: the mask token's id ([MASK]).
        vocab_size: random replacements are drawn from [0, vocab_size).
        special_ids: ids never selected (padding, BOS/[CLS], EOS/[SEP], UNK, the mask).
        rate: the fraction of each row's real tokens selected (BERT: 0.15).
    """

    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    rate: float = 0.15

    def __post_init__(self):
        if not 0.0 < self.rate < 1.0:
            raise errors.ConfigError(f"train.mlm_rate must be in (0, 1), got {self.rate}")


def masking_for(tokenizer, rate: float) -> Masking:
    """The `Masking` of a tokenizer (tfjax's or a checkpoint's), for `model.encoder_head="mlm"`.

    Raises:
        tfjax.errors.ConfigError: for a tokenizer without a mask token.
    """
    if getattr(tokenizer, "mask_id", None) is None:
        raise errors.ConfigError(
            f"model.encoder_head='mlm' masks tokens, but the tokenizer {tokenizer!r} has no mask "
            "token: use a new workdir (tfjax builds its tokenizers with one for MLM runs) or a "
            "checkpoint whose tokenizer has [MASK]"
        )
    specials = tuple(sorted({int(i) for i in tokenizer.special_ids} | {int(tokenizer.mask_id)}))
    return Masking(int(tokenizer.mask_id), int(tokenizer.vocab_size), specials, float(rate))


def check_maskable(rows: list, masking: Masking, *, split: str, unk_id: int | None) -> None:
    """Refuses a split in which masking can select no token: its loss would be 0/0 (NaN) at
    every step, with zero gradients. A row without a candidate is fine (it is scored nowhere);
    a split without one is not.

    Args:
        rows: encoded examples, `inputs` and `inputs_segment_ids` [S] int32 each.
        masking: its `special_ids` are never selected.
        split: the split's name, for the message ("training", "evaluation").
        unk_id: the tokenizer's unknown-word id, to say when every token is unknown.

    Raises:
        tfjax.errors.DataError: when `rows` has rows but no token masking may select.
    """
    special = np.asarray(masking.special_ids)
    real = unknown = 0
    for row in rows:
        tokens = np.asarray(row["inputs"])[np.asarray(row["inputs_segment_ids"]) > 0]
        if not np.isin(tokens, special).all():
            return  # a candidate: the split can be scored
        real += tokens.size
        unknown += int(np.sum(tokens == unk_id)) if unk_id is not None else 0
    if not rows:
        return
    why = (
        f"every word of its {len(rows)} lines is unknown to the tokenizer ({unknown} [UNK])"
        if unknown
        else f"its {len(rows)} lines hold only special tokens ({real} in all)"
    )
    raise errors.DataError(
        f"the {split} split has no token the masked-LM objective can mask and score: {why}; "
        "train on text that the tokenizer's vocabulary covers (data.name, data.train_path): a "
        "workdir keeps the tokenizer it started with, a pretrained run uses its checkpoint's"
    )


def mask_row(
    key: jax.Array, tokens: Int[Array, " S"], candidates: Bool[Array, " S"], masking: Masking
) -> tuple[Int[Array, " S"], Bool[Array, " S"]]:
    """(masked tokens, selected) of one row; see the module docstring."""
    select_key, action_key, random_key = jax.random.split(key, 3)
    count = jnp.sum(candidates)
    wanted = jnp.where(count > 0, jnp.maximum(jnp.round(masking.rate * count), 1), 0)
    # The `wanted` candidates of smallest uniform score: a uniform draw without replacement.
    score = jnp.where(candidates, jax.random.uniform(select_key, tokens.shape), 2.0)  # [S]
    rank = jnp.argsort(jnp.argsort(score))  # [S]: 0 = smallest score
    selected = candidates & (rank < wanted)
    action = jax.random.uniform(action_key, tokens.shape)  # [S]
    random_ids = jax.random.randint(random_key, tokens.shape, 0, masking.vocab_size, tokens.dtype)
    masked = jnp.where(action < MASK_FRACTION, masking.mask_id, tokens)
    masked = jnp.where(action >= 1.0 - RANDOM_FRACTION, random_ids, masked)
    return jnp.where(selected, masked, tokens), selected


def mask_tokens(
    keys: jax.Array,
    tokens: Int[Array, "B S"],
    segment_ids: Int[Array, "B S"],
    masking: Masking,
) -> tuple[Int[Array, "B S"], Bool[Array, "B S"]]:
    """Masks each row with its own key.

    Args:
        keys: [B] one PRNG key per row.
        tokens: [B, S] int32 ids.
        segment_ids: [B, S] int32; 0 = padding (never selected).
        masking: the mask id, vocabulary, special ids and rate.

    Returns:
        (masked tokens [B, S] int32, selected [B, S] bool).
    """
    special = jnp.isin(tokens, jnp.asarray(masking.special_ids, tokens.dtype))
    candidates = (segment_ids > 0) & ~special  # [B, S]
    row = lambda k, t, c: mask_row(k, t, c, masking)  # noqa: E731
    return jax.vmap(row)(keys, tokens, candidates)


def mask_batch(batch: dict, masking: Masking, key: jax.Array, *, first_row=0) -> dict:
    """The batch with `inputs` masked, the original ids as `mlm_targets` and the selected
    positions as `mlm_weights` ([B, S] float32): a train step's masking.

    Args:
        batch: `inputs` and `inputs_segment_ids` [B, S] int32.
        masking: see `Masking`.
        key: the step's masking key.
        first_row: the global index of the batch's first row (a device's slice under pmap).
    """
    tokens = batch["inputs"]
    rows = first_row + jnp.arange(tokens.shape[0])  # [B]
    keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)
    return _masked(batch, mask_tokens(keys, tokens, batch["inputs_segment_ids"], masking))


def mask_eval_batch(batch: dict, masking: Masking, seed: int = 0) -> dict:
    """`mask_batch` for evaluation: each row's key comes from `seed` and its tokens, so the
    masks do not depend on the batch or device an example lands in."""
    tokens, segment_ids = batch["inputs"], batch["inputs_segment_ids"]
    weights = jnp.arange(1, tokens.shape[1] + 1, dtype=jnp.uint32) * jnp.uint32(2654435761)
    digest = jnp.sum(tokens.astype(jnp.uint32) * weights * (segment_ids > 0), axis=1)  # [B]
    base = jax.random.key(seed)
    keys = jax.vmap(lambda d: jax.random.fold_in(base, d))(digest)
    return _masked(batch, mask_tokens(keys, tokens, segment_ids, masking))


def _masked(batch: dict, result) -> dict:
    masked, selected = result
    return {
        **batch,
        "inputs": masked,
        TARGETS: batch["inputs"],
        WEIGHTS: selected.astype(jnp.float32),
    }


def metrics(
    logits: Float[Array, "B S V"],
    targets: Int[Array, "B S"],
    weights: Float[Array, "B S"],
    *,
    label_smoothing: float | jax.Array = 0.0,
) -> dict[str, Array]:
    """Masked-LM sums: loss, nll, correct and weight over the selected positions only.

    Args:
        logits: [B, S, V] of the masked inputs.
        targets: [B, S] int32, the original (unmasked) ids.
        weights: [B, S] float32, 1 at the selected positions.
        label_smoothing: ε (`tfjax.nn.losses.cross_entropy`).

    Returns:
        Float32 `loss_sum`, `nll_sum`, `correct_sum`, `weight_sum`; `losses.summarize` turns
        them into loss, perplexity and masked-token accuracy.
    """
    loss_sum, nll_sum = losses.cross_entropy(
        logits, targets, weights, label_smoothing=label_smoothing
    )
    predictions = losses.argmax(logits).astype(targets.dtype)  # [B, S]
    return {
        "loss_sum": loss_sum,
        "nll_sum": nll_sum,
        "correct_sum": jnp.sum((predictions == targets) * weights),
        "weight_sum": jnp.sum(weights),
    }
