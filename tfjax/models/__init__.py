"""The models: `ModelConfig` and the three Transformers, one module each.

Sources:
- encoder-decoder Transformer, base and big sizes: Vaswani et al. 2017, §3 and Table 3;
- encoder-only with a [CLS]-pooled classifier and a masked-LM head: Devlin et al. 2019 (BERT),
  §3 and Appendix A;
- decoder-only causal language model: Radford et al. 2018 (GPT), §3.1; Liu et al. 2018, §4.

`from tfjax import models` gives the names below; the stacks they are built from live in
`tfjax.models.transformer`.
"""

import flax.linen as nn

from tfjax.models import kinds
from tfjax.models.common import shift_right
from tfjax.models.config import (
    DTYPES,
    ENCODER_HEADS,
    OUTPUT_BIASES,
    POSITIONALS,
    PRESETS,
    ModelConfig,
    preset,
)
from tfjax.models.decoder_only import DecoderOnly
from tfjax.models.encoder_decoder import EncoderDecoder
from tfjax.models.encoder_only import EncoderOnly

__all__ = [
    "DTYPES",
    "ENCODER_HEADS",
    "OUTPUT_BIASES",
    "POSITIONALS",
    "PRESETS",
    "DecoderOnly",
    "EncoderDecoder",
    "EncoderOnly",
    "ModelConfig",
    "create_model",
    "kinds",
    "preset",
    "shift_right",
]


def create_model(config: ModelConfig) -> nn.Module:
    """The model class of the kind `config.kind` names (`kinds.get`), bound to `config`."""
    return kinds.get(config.kind).model(config)
