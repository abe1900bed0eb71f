"""Canon layers (Allen-Zhu 2025): a residual causal depthwise convolution of 4 taps, h + conv(h), at up to
four sites of a block (``block.canon``):

- ``a``: the attention's input, after the norm (the block's);
- ``b``: the attention's queries, keys and values (inside the attention: after qk-norm, before the
  position's rotation);
- ``c``: the MLP's input, after the norm (the block's);
- ``d``: the MLP's hidden units, before the activation (inside the MLP: a gated MLP's gate and up both).

Each site keeps its last 3 inputs in the layer's decoding state (:class:`zoo.parts.state.LayerState`),
so cached decoding continues the convolution where the previous call stopped.

The same layer on a branch's output, before the residual add (``block.out_conv``: ``attn``, ``mlp`` or
``attn,mlp``), keeps its last 3 outputs there too.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.core.errors import ConfigError
from zoo.core.registry import OptionDoc
from zoo.parts.convolution import short_convolution
from zoo.parts.state import LayerState

#: The sites, in the order a block meets them, and where each sits.
SITES: dict[str, str] = {
    "a": "the attention's input, after the norm",
    "b": "the attention's queries, keys and values",
    "c": "the MLP's input, after the norm",
    "d": "the MLP's hidden units, before the activation",
}
#: The sites a block applies itself; ``b`` and ``d`` are inside the attention and the MLP.
BLOCK_SITES = ("a", "c")
#: The convolution's taps (the reference's canon_kernel).
KERNEL = 4
#: ``block.canon``'s default: no canon layer.
NONE = "none"
#: ``block.out_conv``'s branches, in the order a block meets them, and where each layer sits.
OUT_SITES: dict[str, str] = {
    "attn": "the attention branch's output, before the residual add",
    "mlp": "the MLP branch's output, before the residual add",
}

DOC = OptionDoc(
    "canon",
    values="none, or sites from abcd in order (a, ac, abcd, ...)",
    formula="h -> h + conv(h), conv(h)_i = sum_j w_j ⊙ h_{i-3+j} (j = 0..3, one 4-tap filter per channel, "
    "no bias, earlier tokens than the first are zeros, padding enters as zeros, so do other documents' tokens under "
    "task.doc_mask); at a: the attention's input "
    "after the norm, b: q, k, v after qk-norm and before rotation, c: the MLP's input after the norm, d: the "
    "MLP's hidden units before the activation (a gated MLP's gate and up); a decoding state of the last 3 "
    "inputs per site",
    cost="27 x channels per site: 6 x 4 x channels (its parameters) + 3 x channels (the residual sum); channels: "
    "d_model at a and c, the q, k and v widths at b, the hidden width at d (twice it for a gated MLP)",
    reference="Allen-Zhu 2025, Physics of Language Models: Part 4.1, Architecture Design and the Magic of Canon "
    "Layers, arXiv:2512.17351; facebookresearch/PhysicsLM4 huggingface/canon_helper.py",
)

#: Where zoo's canon layers differ from the reference, and why (docs/parts.md, "Block options").
NOTES = (
    "As the reference (PhysicsLM4 `canon_helper.py` with its defaults: residual, no bias, no activation, 4 taps): a "
    "at the attention's input after the norm, c at the MLP's, b on the concatenated q, k, v after qk-norm and before "
    "rotation, d on a gated MLP's concatenated gate and up before the activation; kernels drawn as torch's Conv1d "
    "draws them (uniform within ±1/2), padding masked to zeros. Where zoo goes beyond it: d on a plain MLP (gelu, "
    "relu, relu2) is on up(x), before the activation (the reference has gated MLPs only); b on `gated_deltanet` and "
    "`kda` follows their short convolution and SiLU (the reference's GDN2Canon), on `linear` it is on `qkv`'s output "
    "before the feature map. Refused: b with `mla` (its keys and values come from a cached latent, which the "
    "reference has no canon for) and with `mamba2` (none placed on its x, B, C yet) and d with `moe` (a token's "
    "hidden units are its experts', so neighbours' differ); any site under `parallel.tp` > 1 (a convolution along "
    "the sequence); a model cannot rewind a layer with canon layers (`truncate`), as they keep only their last 3 "
    "inputs.",
)


OUT_CONV_DOC = OptionDoc(
    "out_conv",
    values="none, attn, mlp, attn,mlp",
    formula="o -> o + conv(o) on a branch's output o before the residual add (x + drop(o) under pre-norm; inside "
    "sandwich's output norm), conv as canon's: 4 taps per channel, no bias, earlier tokens than the first are "
    "zeros, padding enters as zeros, so do other documents' outputs under task.doc_mask; a decoding state of the "
    "last 3 outputs per branch",
    cost="27 x d_model per branch: 6 x 4 x d_model (its parameters) + 3 x d_model (the residual sum)",
    reference="Marin PR 8227 (short convolutions on the branch outputs); Inkling; the layer itself: canon's",
)
#: Where zoo's branch-output convolutions stand (docs/parts.md, "Block options").
OUT_CONV_NOTES = (
    "`block.out_conv` puts canon's layer (the same `Canon` module, kernel draw and decoding state) on the "
    "attention branch's output and/or the MLP branch's, after the branch's output projection and before the "
    "residual add, with the residual form o + conv(o) (so the branch's own output passes through) and canon's 4 "
    "taps; Marin PR 8227's kernel size and whether its convolution is residual are not checked against its code. "
    "A cross-attention branch takes none. Refused under `parallel.tp` > 1, as canon is; a layer with it cannot "
    "rewind (`truncate`).",
)


def out_conv_sites(value: object) -> tuple[str, ...]:
    """``block.out_conv`` checked: the branches it names (``()`` for ``none``). Raises ConfigError naming the key,
    the value and what is allowed: ``none``, ``attn``, ``mlp`` or ``attn,mlp`` (each once, in that order)."""
    allowed = f"{NONE}, attn, mlp or attn,mlp: " + "; ".join(f"{site}: {where}" for site, where in OUT_SITES.items())
    if value == NONE:
        return ()
    if not isinstance(value, str) or not value:
        raise ConfigError("block.out_conv", value, allowed)
    sites = tuple(value.split(","))
    if tuple(site for site in OUT_SITES if site in sites) != sites:
        raise ConfigError("block.out_conv", value, allowed)
    return sites


def block_out_conv(sites: tuple[str, ...], d_model: int) -> nn.ModuleDict | None:
    """A block's branch-output convolutions (``block.out_conv``'s branches, over d_model channels), or None."""
    return nn.ModuleDict({site: Canon(d_model, site) for site in sites}) if sites else None


def canon_sites(value: object) -> str:
    """``block.canon`` checked: the sites it names (``""`` for ``none``). Raises ConfigError naming the key,
    the value and what is allowed: ``none``, or letters from ``abcd``, each at most once, in that order."""
    allowed = f"{NONE} or sites from {''.join(SITES)}, each once and in that order (a, ac, abcd, ...): " + "; ".join(
        f"{site}: {where}" for site, where in SITES.items()
    )
    if value == NONE:
        return ""
    if not isinstance(value, str) or not value:
        raise ConfigError("block.canon", value, allowed)
    unknown = sorted(set(value) - set(SITES))
    if unknown:
        raise ConfigError("block.canon", value, f"{allowed}; {', '.join(map(repr, unknown))} is no site")
    repeated = sorted({site for site in value if value.count(site) > 1})
    if repeated:
        raise ConfigError("block.canon", value, f"{allowed}; {', '.join(map(repr, repeated))} repeats")
    in_order = "".join(site for site in SITES if site in value)
    if value != in_order:
        raise ConfigError("block.canon", value, f"{allowed}; write it {in_order!r}")
    return value


def unapplied_site(sites: str, attn: type, mlp: type) -> str | None:
    """The first of ``sites`` that lies inside a part (``b``: the attention, ``d``: the MLP) whose class does
    not apply it (its ``canon_sites`` hook, zoo.core.interface), else None."""
    from zoo.core.interface import hook

    inside = {"b": attn, "d": mlp}
    return next((s for s in sites if s in inside and s not in hook(inside[s], "canon_sites")), None)


def applied_sites(sites: str, attn: type, mlp: type) -> str:
    """``sites`` less those inside a part that does not apply them (``b`` without an attention that applies
    it, ``d`` likewise): every site a block of these parts can take."""
    from zoo.core.interface import hook

    inside = {"b": attn, "d": mlp}
    return "".join(s for s in sites if s not in inside or s in hook(inside[s], "canon_sites"))


class Canon(nn.Module):
    """One canon layer: y = h + conv(h), a causal depthwise convolution of :data:`KERNEL` taps over time with
    no bias (the reference's defaults: residual, no bias, no activation).

    ``kernel`` (channels, 1, 4): tap j weighs the input 3 - j tokens back (tap 3 the present one); drawn as
    torch's Conv1d draws it (uniform within ±1 / sqrt(4), the reference's reset_parameters), by
    :func:`init_canon` when a model redraws its weights. ``site`` names the layer's slot in the decoding
    state, where it keeps its last 3 inputs.
    """

    def __init__(self, channels: int, site: str) -> None:
        super().__init__()
        if site not in SITES and site not in OUT_SITES:
            raise ValueError(f"canon site {site!r}: one of {', '.join([*SITES, *OUT_SITES])}")
        self.channels, self.site = channels, site
        self.kernel = nn.Parameter(torch.empty(channels, 1, KERNEL))
        init_canon(self.kernel)

    def extra_repr(self) -> str:
        return f"{self.channels}, site={self.site}"

    def state_size(self) -> int:
        """Numbers one sample's decoding state holds for this layer: its last 3 inputs."""
        return (KERNEL - 1) * self.channels

    def extra_flops(self, seq_len: int) -> int:
        """The residual sum, one per channel (x 3 for forward and backward); the convolution's multiply-adds
        are 6 x its parameters, which the model counts."""
        return 3 * self.channels

    def forward(
        self,
        h: torch.Tensor,
        real: torch.Tensor | None = None,
        cache: LayerState | None = None,
        taps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """h (b, t, channels) -> h + conv(h). ``real`` (b, t) bool: False at padding, which enters the
        convolution as zeros. ``cache``: the layer's decoding state, whose inputs before ``h`` the convolution
        reads (zeros without one) and where it keeps its last 3 (written in place). ``taps`` (b, t, 4) bool
        (zoo.parts.documents.Documents.taps): False where a tap reaches into another document (read as zero)."""
        x = h if real is None else h * real[..., None].to(h.dtype)
        tail = None if cache is None else cache.canon_tail(self.site)
        mixed, tail = short_convolution(x, self.kernel, tail, taps)
        if cache is not None:
            cache.hold_canon(self.site, tail)
        return h + mixed


def init_canon(kernel: torch.Tensor) -> None:
    """The reference's draw for a canon kernel (torch's Conv1d default: kaiming_uniform_ with a = sqrt(5),
    uniform within ±1 / sqrt(fan-in), the fan-in being the 4 taps of one channel's filter)."""
    nn.init.kaiming_uniform_(kernel, a=math.sqrt(5))


def block_canon(sites: str, d_model: int) -> nn.ModuleDict | None:
    """A block's own canon layers (sites ``a`` and ``c`` of ``sites``, over d_model channels), or None."""
    own = [site for site in BLOCK_SITES if site in sites]
    return nn.ModuleDict({site: Canon(d_model, site) for site in own}) if own else None
