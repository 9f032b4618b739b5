"""The PyTorch peer of the train benchmark (`python -m experiments.bench --peer=torch`).

`torch.nn.Transformer` set up as close to tfjax's benchmark model as torch allows: post-LN
(`norm_first=False`, as in Vaswani et al. 2017, §3.1), ReLU, LayerNorm epsilon 1e-6, one token
embedding [V, D] shared by source and target, scaled by sqrt(D), plus the fixed sinusoidal
positions of §3.5 (sin on even, cos on odd dims), dropout on the embeddings and the residuals
(§5.4), output projection tied to the embedding (§3.4), causal decoder self-attention, padding
taken from the segment ids (never from token id 0), cross-entropy with label smoothing 0.1 that
ignores padding, and Adam(0.9, 0.98, 1e-9) with the paper's learning-rate schedule (§5.3).

What still differs (also in `NOTES`, which the benchmark prints):
- `nn.Transformer` ends both stacks with a LayerNorm; tfjax's post-LN model has none
  (`ModelConfig.final_norm=False`), so torch has 4 * D more parameters.
- `nn.Transformer`'s single `dropout` also drops attention probabilities and the feed-forward
  hidden units, which tfjax does not (`attention_dropout_rate=0`, no hidden dropout); those two
  are set to 0 after construction so both sides draw the same dropout masks.
- Smoothed losses differ by a constant: torch spreads ε over all V classes, tfjax over the V - 1
  others and subtracts the target entropy. Only speed is compared, never loss values.
- The tfjax step also returns token accuracy and the gradient norm (a few reductions).

torch is imported inside the functions, so this module imports without it.
"""

import contextlib
import math

import numpy as np

from tfjax import errors

PEER = "torch"
INSTALL_HINT = 'pip install "tfjax[parity]"'
NOTES = (
    "torch.nn.Transformer adds a final LayerNorm to the encoder and decoder stacks; tfjax's "
    "post-LN model has none (4*D more torch parameters)",
    "torch attention-probability and feed-forward-hidden dropout set to 0 to match tfjax",
    "smoothed loss values differ by a constant (torch spreads eps over V classes); "
    "speed only is compared",
)
WARMUP_STEPS = 4000  # tfjax's OptimConfig default
# Compute dtype -> torch.autocast dtype (None: no autocast). Parameters, Adam state and the
# loss stay float32 either way, as tfjax keeps its parameters (param_dtype float32).
AUTOCAST = {"float32": None, "bfloat16": "bfloat16", "float16": "float16"}


def require_torch():
    """Imports torch, or raises `tfjax.errors.DependencyError` (an ImportError) saying how."""
    try:
        import torch
    except ImportError as error:
        raise errors.DependencyError(
            f"--peer=torch needs PyTorch: install the 'parity' extra with {INSTALL_HINT}"
        ) from error
    return torch


def info(device: str = "cpu") -> dict:
    """Name, version, device and intra-op thread count (left at torch's default) of the peer."""
    torch = require_torch()
    out = {"name": PEER, "version": torch.__version__, "threads": torch.get_num_threads()}
    out["device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return out


def check_device(device: str, dtype: str) -> None:
    """Raises ValueError for a device or compute dtype the peer does not run (with the fix)."""
    torch = require_torch()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"torch peer device {device!r}: use 'cpu' or 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "JAX computes on a GPU but this torch build sees no CUDA device: install a CUDA "
            "build of torch, or run the benchmark without --peer"
        )
    if dtype not in AUTOCAST:
        raise ValueError(f"torch peer compute dtype {dtype!r}: use one of {sorted(AUTOCAST)}")


def sinusoid_table(length: int, dim: int) -> np.ndarray:
    """[L, D] float32: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...) (§3.5)."""
    positions = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
    angles = positions / 10000.0 ** (np.arange(0, dim, 2) / dim)  # [L, D/2]
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table.astype(np.float32)


def build_model(shape: dict):
    """ModuleDict with "embed" (nn.Embedding [V, D]), "transformer" and "dropout", in train mode.

    `shape` holds the benchmark's model fields (`workload.SHAPE`).
    """
    torch = require_torch()
    d = shape["embed_dim"]
    transformer = torch.nn.Transformer(
        d_model=d,
        nhead=shape["num_heads"],
        num_encoder_layers=shape["num_layers"],
        num_decoder_layers=shape["num_decoder_layers"],
        dim_feedforward=shape["mlp_dim"],
        dropout=shape["dropout_rate"],
        activation="relu",
        layer_norm_eps=1e-6,
        batch_first=True,
        norm_first=False,
    )
    for layer in [*transformer.encoder.layers, *transformer.decoder.layers]:
        layer.dropout.p = 0.0  # feed-forward hidden units (tfjax: none)
        for name in ("self_attn", "multihead_attn"):
            if hasattr(layer, name):
                getattr(layer, name).dropout = 0.0  # attention probabilities (tfjax: 0)
    embed = torch.nn.Embedding(shape["vocab_size"], d)
    torch.nn.init.normal_(embed.weight, std=d**-0.5)  # as tfjax's layers.Embed
    modules = torch.nn.ModuleDict(
        {
            "embed": embed,
            "transformer": transformer,
            "dropout": torch.nn.Dropout(shape["dropout_rate"]),
        }
    )
    return modules.train()


def num_params(shape: dict) -> int:
    """Parameter count of `build_model(shape)` (built on the meta device: no memory, no init)."""
    torch = require_torch()
    with torch.device("meta"):
        modules = build_model(shape)
    return sum(p.numel() for p in modules.parameters())


def _paper_lr(d: int):
    """Vaswani et al. 2017 eq. (3) at s = step + 1, as tfjax's `schedules.paper_schedule`."""
    return lambda step: d**-0.5 * min((step + 1) ** -0.5, (step + 1) * WARMUP_STEPS**-1.5)


def _tensors(shape: dict, batch: dict, device: str = "cpu") -> dict:
    """Torch tensors on `device` of a `workload.random_batch` dict: ids, shifted decoder inputs,
    labels, masks."""
    torch = require_torch()
    inputs, targets = batch["inputs"], batch["targets"]  # [B, S], [B, L] int32
    src_seg, tgt_seg = batch["inputs_segment_ids"], batch["targets_segment_ids"]
    bos = np.full((targets.shape[0], 1), 1, targets.dtype)
    decoder_inputs = np.concatenate([bos, targets[:, :-1]], axis=1) * (tgt_seg > 0)  # [B, L]
    length = targets.shape[1]
    tensors = {
        "inputs": torch.from_numpy(inputs.astype(np.int64)),
        "decoder_inputs": torch.from_numpy(decoder_inputs.astype(np.int64)),
        "labels": torch.from_numpy(np.where(tgt_seg > 0, targets, -100).astype(np.int64)),
        "src_padding": torch.from_numpy(src_seg == 0),  # [B, S] True = padding
        "tgt_padding": torch.from_numpy(tgt_seg == 0),  # [B, L] True = padding
        "causal": torch.triu(torch.ones(length, length, dtype=torch.bool), 1),  # True = masked
        "positions": torch.from_numpy(
            sinusoid_table(max(inputs.shape[1], length), shape["embed_dim"])
        ),
    }
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def _loss(modules, t: dict, vocab_size: int):
    """Label-smoothed cross-entropy (mean over non-padding targets) of one forward pass."""
    torch = require_torch()
    embed, d = modules["embed"], modules["embed"].embedding_dim

    def embed_tokens(tokens):  # [B, L] -> [B, L, D]
        x = embed(tokens) * math.sqrt(d) + t["positions"][: tokens.shape[1]]
        return modules["dropout"](x)

    decoded = modules["transformer"](
        embed_tokens(t["inputs"]),
        embed_tokens(t["decoder_inputs"]),
        tgt_mask=t["causal"],
        src_key_padding_mask=t["src_padding"],
        tgt_key_padding_mask=t["tgt_padding"],
        memory_key_padding_mask=t["src_padding"],
        tgt_is_causal=True,
    )  # [B, L, D]
    logits = torch.nn.functional.linear(decoded, embed.weight)  # [B, L, V], tied
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, vocab_size),  # [B * L, V]
        t["labels"].reshape(-1),  # [B * L], -100 on padding
        ignore_index=-100,
        label_smoothing=0.1,
    )


def make_train_step(
    shape: dict,
    batch: dict,
    *,
    learning_rate: float | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
):
    """A closure doing one full train step on `batch`; returns the loss as a Python float.

    Args:
      shape: the benchmark's model fields (`workload.SHAPE`).
      batch: a `workload.random_batch` dict: "inputs" [B, S], "targets" [B, L] and their
        segment ids (0 = padding), int32 numpy.
      learning_rate: None = the paper schedule (what tfjax's benchmark uses); a float = constant.
      seed: torch's global seed, set here for the initialisation and the dropout masks.
      device: "cpu" or "cuda".
      dtype: compute dtype: "float32", or "bfloat16" / "float16" under `torch.autocast`
        (parameters and optimizer state stay float32).

    Returns:
      `step() -> float`: zero_grad, forward in train mode (dropout on), loss, backward,
      Adam step (and schedule step). `.item()` makes it synchronous.
    """
    torch = require_torch()
    check_device(device, dtype)
    torch.manual_seed(seed)
    modules = build_model(shape).to(device)
    tensors = _tensors(shape, batch, device)
    autocast = AUTOCAST[dtype]
    optimizer = torch.optim.Adam(
        modules.parameters(),
        lr=1.0 if learning_rate is None else learning_rate,
        betas=(0.9, 0.98),
        eps=1e-9,
    )
    factor = _paper_lr(shape["embed_dim"]) if learning_rate is None else (lambda step: 1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with (
            torch.autocast(device, dtype=getattr(torch, autocast))
            if autocast
            else contextlib.nullcontext()
        ):
            loss = _loss(modules, tensors, shape["vocab_size"])
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss.item()

    return step
