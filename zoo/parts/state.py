"""Decoding state: what each layer keeps between calls when a sequence is fed in pieces.

A model hands every block one :class:`LayerState` (``model.new_caches()``). The layer's sequence
mixer keeps its own kind of :class:`MixerState` in it, made on first use
(``cache.mixer_state(KVCache)``): keys and values for softmax attention (:class:`KVCache`;
:class:`SharedKV` for a layer reading its group's, ``model.kv_share``), a latent and a rotary key for latent
attention, a constant-size matrix for a linear mixer. A decoder block's cross-attention keeps its memory's keys
and values beside it (``cross``). The model and ``generate`` only read ``length`` and ``nbytes``
and call ``reset``/``truncate``, so a new mixer brings its own state without touching them.

Static states (``model.new_caches(max_len, static=True)``, used by :class:`zoo.StaticDecoder`) keep
their length as a device tensor (``cursor``) and their buffers at ``max_len`` slots from the first
write: a decoding step then has the same shapes and reads no Python number that changes, so one
compiled graph (or CUDA graph) serves every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from zoo.core.errors import ConfigError

S = TypeVar("S", bound="MixerState")


def nbytes(*tensors: torch.Tensor | None) -> int:
    """Bytes held by the given tensors (None counts 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class MixerState:
    """One sequence mixer's decoding state. Subclasses define ``nbytes``, ``reset`` and, where they
    can rewind, ``truncate``; mixers read the slots of new tokens from :meth:`slots` and count them
    with :meth:`advance`.

    ``static`` (set by :class:`LayerState` for subclasses with ``supports_static``): the length lives
    in ``cursor``, a 0-d long tensor on the tokens' device, so that decoding steps neither read nor
    change a Python number; ``length`` then costs a host sync (read it between steps, not in them).
    """

    #: Whether the state can run static (:class:`GrowingState` and recurrent states can).
    supports_static = False

    def __init__(self, max_len: int | None = None) -> None:
        if max_len is not None and max_len < 1:
            raise ConfigError("max_len", max_len, "must be a positive integer or None")
        self.max_len = max_len
        self.static = False
        self.cursor: torch.Tensor | None = None  # static: the length, made on the first slots() call
        self._length = 0

    @property
    def length(self) -> int:
        """Tokens seen so far."""
        return int(self.cursor) if self.cursor is not None else self._length

    @length.setter
    def length(self, value: int) -> None:
        self._set_length(value)

    def slots(self, time: int, device: torch.device) -> torch.Tensor:
        """Slot indices (time,) of the next ``time`` tokens: ``length .. length + time - 1``."""
        if self.static:
            if self.cursor is None:
                self.cursor = torch.zeros((), dtype=torch.long, device=device)
                mark_static(self.cursor)
            return self.cursor + torch.arange(time, device=device)
        return torch.arange(self._length, self._length + time, device=device)

    def advance(self, time: int) -> None:
        """Count ``time`` more tokens as seen (in place on ``cursor`` when static)."""
        if self.cursor is not None:
            self.cursor.add_(time)
        else:
            self._length += time

    @property
    def nbytes(self) -> int:
        """Bytes held by the state's buffers."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget every token (buffers may be kept for reuse)."""
        self._set_length(0)

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` tokens (rewind decoding steps)."""
        if not 0 <= length <= self.length:
            raise ConfigError("length", length, f"must be in 0..{self.length} (the tokens held)")
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        if self.cursor is not None:
            self.cursor.fill_(length)
        else:
            self._length = length


def query_slots(state: MixerState | None, time: int, device: torch.device) -> torch.Tensor:
    """Slot indices (time,) of a call's tokens: after those ``state`` holds, or 0..time-1 without one."""
    return torch.arange(time, device=device) if state is None else state.slots(time, device)


def mark_static(tensor: torch.Tensor) -> None:
    """Tell torch.compile that ``tensor`` keeps its address across calls (CUDA graphs then read it in
    place instead of copying it in, and may write it)."""
    torch._dynamo.mark_static_address(tensor)


def keep(held: torch.Tensor | None, new: torch.Tensor, static: bool) -> torch.Tensor:
    """The tensor a recurrent state holds for ``new``: ``new`` itself, or (static) a copy at a fixed
    address: ``held``, overwritten in place, when it has the same shape."""
    if not static:
        return new
    if held is not None and held.shape == new.shape:
        return held.copy_(new)
    copy = new.clone()
    mark_static(copy)
    return copy


def forget(held: torch.Tensor | None, static: bool) -> torch.Tensor | None:
    """What a recurrent state holds after a reset: nothing, or (static) ``held`` zeroed at the same address."""
    return held.zero_() if static and held is not None else None


class LayerState:
    """One layer's decoding state: its sequence mixer's :class:`MixerState` (``mixer``, made by the
    mixer on its first call), a cross-attention's memory keys and values (``cross``) and each canon
    layer's last inputs (``canon``: site -> (batch, kernel - 1, channels), zoo.parts.canon; in the first layer's
    state, ``smear`` -> (batch, 1, d_model), the last token embedding under ``model.smear``).

    ``max_len`` (prompt + new tokens) lets growing states preallocate; they grow past it if needed.
    ``static``: the mixer's state is static (see :class:`MixerState`): ``max_len`` slots, never more.
    """

    def __init__(self, max_len: int | None = None, static: bool = False) -> None:
        if max_len is not None and max_len < 1:
            raise ConfigError("max_len", max_len, "must be a positive integer or None")
        if static and max_len is None:
            raise ConfigError("max_len", max_len, "a static state needs its capacity: prompt + new tokens")
        self.max_len = max_len
        self.static = static
        self.mixer: MixerState | None = None
        self.cross: tuple[torch.Tensor, torch.Tensor] | None = None
        self.canon: dict[str, torch.Tensor] = {}

    def canon_tail(self, site: str) -> torch.Tensor | None:
        """The canon layer at ``site``'s last inputs before this call (None before its first)."""
        return self.canon.get(site)

    def hold_canon(self, site: str, tail: torch.Tensor) -> None:
        """Keep the canon layer at ``site``'s last inputs (static: copied into the held tensor, in place)."""
        self.canon[site] = keep(self.canon.get(site), tail, self.static)

    def mixer_state(self, kind: Callable[[int | None], S]) -> S:
        """The mixer's state, made by ``kind(max_len)`` on first use (``kind``: a MixerState class)."""
        if self.mixer is None:
            state = kind(self.max_len)
            if self.static:
                if not state.supports_static:
                    raise ValueError(f"{type(state).__name__} cannot run static (its supports_static is False)")
                state.static = True
            self.mixer = state
        elif isinstance(kind, type) and not isinstance(self.mixer, kind):
            raise TypeError(
                f"this layer state holds a {type(self.mixer).__name__}, not a {kind.__name__}; "
                "give each layer its own state (model.new_caches())"
            )
        return self.mixer  # type: ignore[return-value]

    @property
    def length(self) -> int:
        """Tokens the layer has seen (0 before its first call)."""
        return 0 if self.mixer is None else self.mixer.length

    @property
    def nbytes(self) -> int:
        """Bytes held: the mixer's state, the cross-attention memory's keys and values and the canon layers'
        last inputs."""
        return (0 if self.mixer is None else self.mixer.nbytes) + nbytes(*(self.cross or ()), *self.canon.values())

    def reset(self) -> None:
        """Forget every token and the cross-attention memory (buffers are kept for reuse)."""
        if self.mixer is not None:
            self.mixer.reset()
        self.cross = None
        if self.static:  # zeros at the same addresses: the inputs before a first token
            for tail in self.canon.values():
                tail.zero_()
        else:
            self.canon = {}

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` tokens (a mixer that cannot rewind says so, as do canon layers,
        which keep only their last inputs)."""
        if self.canon and length != self.length:
            raise ConfigError(
                "length",
                length,
                f"must be {self.length}: canon layers (block.canon) and the smear (model.smear) keep only their last "
                "inputs, so they cannot rewind",
            )
        if self.mixer is None:
            if length:
                raise ConfigError("length", length, "must be 0: the layer has seen no token")
            return
        self.mixer.truncate(length)


class GrowingState(MixerState):
    """Per-token tensors (time on dim -2 of each) in preallocated buffers, written in place.

    The buffers get ``max_len`` slots at the first write (default: that write's length); a write past
    the capacity reallocates to twice the size. ``positions`` (batch, capacity) holds per-sample
    position ids when a writer passes them (for score biases); otherwise slot ``s`` is position ``s``.

    Static: zeroed buffers of ``max_len`` slots from the first write, written at the cursor by
    ``index_copy_``; writes return the whole buffers (the slots after the present hold zeros, or an
    earlier request's keys after a reset, and the causal mask hides them), and writing past
    ``max_len`` is an index error.
    """

    supports_static = True

    def __init__(self, max_len: int | None = None) -> None:
        super().__init__(max_len)
        self.buffers: list[torch.Tensor] | None = None
        self.positions: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.buffers is None else self.buffers[0].shape[-2]

    @property
    def nbytes(self) -> int:
        return nbytes(*(self.buffers or ()), self.positions)

    def write(self, *new: torch.Tensor, positions: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Write ``new`` tensors (each (..., t_new, features), batch first) after the held ones; return
        views of everything held. positions: (b, t_new) position ids of the new tokens, kept when given."""
        if self.static:
            return self._write_static(new, positions)
        start, end = self.length, self.length + new[0].shape[-2]
        if self.buffers is None or (start == 0 and not self._fits(new)):
            self.positions = None
            self._allocate(new, max(self.max_len or 0, end))
        elif not self._fits(new):
            self._fits_or_raise(new)
        elif end > self.capacity:
            self._allocate(new, max(end, 2 * self.capacity))
        assert self.buffers is not None
        for buffer, tensor in zip(self.buffers, new, strict=True):
            buffer[..., start:end, :] = tensor
        if positions is not None or self.positions is not None:
            batch = new[0].shape[0]
            if self.positions is None:  # the tokens so far had their slots as positions
                slots = torch.arange(self.capacity, device=new[0].device)
                self.positions = slots.expand(batch, -1).clone()  # (b, capacity), a copy, not a view
            ids = torch.arange(start, end, device=new[0].device) if positions is None else positions
            self.positions[:, start:end] = ids
        self._length = end
        return [buffer[..., :end, :] for buffer in self.buffers]

    def key_positions(self) -> torch.Tensor | None:
        """Per-sample position ids (b, keys) of the keys :meth:`write` returned, or None (slots)."""
        if self.positions is None or self.static:
            return self.positions
        return self.positions[:, : self.length]

    def _write_static(self, new: tuple[torch.Tensor, ...], positions: torch.Tensor | None) -> list[torch.Tensor]:
        """Write at the cursor into fixed buffers of ``max_len`` slots; return the whole buffers."""
        assert self.max_len is not None, "LayerState(static=True) requires max_len"
        if self.buffers is None or not self._fits(new):
            if self.buffers is not None and self.length:
                self._fits_or_raise(new)
            self.buffers = [t.new_zeros(*t.shape[:-2], self.max_len, t.shape[-1]) for t in new]
            self.positions = None
            for buffer in self.buffers:
                mark_static(buffer)
        slots = self.slots(new[0].shape[-2], new[0].device)  # (t_new,)
        for buffer, tensor in zip(self.buffers, new, strict=True):
            buffer.index_copy_(-2, slots, tensor)
        if positions is not None and self.positions is None:  # the tokens so far had their slots as positions
            self.positions = torch.arange(self.max_len, device=slots.device).expand(positions.shape[0], -1).clone()
            mark_static(self.positions)
        if self.positions is not None:
            ids = slots.expand(new[0].shape[0], -1) if positions is None else positions
            self.positions.index_copy_(1, slots, ids)
        self.advance(new[0].shape[-2])
        return list(self.buffers)

    def _fits_or_raise(self, new: tuple[torch.Tensor, ...]) -> None:
        """Raise unless ``new`` matches the buffers (another batch needs a reset() first)."""
        assert self.buffers is not None
        if not self._fits(new):
            held = ", ".join(f"{tuple(b.shape)} {b.dtype}" for b in self.buffers)
            got = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in new)
            raise ValueError(
                f"{type(self).__name__} holds buffers {held}, got {got}; reset() it before decoding another batch"
            )

    def _fits(self, new: tuple[torch.Tensor, ...]) -> bool:
        """Whether ``new`` matches the buffers in every size but time, dtype and device."""
        assert self.buffers is not None
        return len(new) == len(self.buffers) and all(
            b.shape[:-2] == t.shape[:-2] and b.shape[-1] == t.shape[-1] and b.dtype == t.dtype and b.device == t.device
            for b, t in zip(self.buffers, new, strict=True)
        )

    def _allocate(self, like: tuple[torch.Tensor, ...], capacity: int) -> None:
        """(Re)allocate buffers of ``capacity`` slots, keeping the tokens written so far."""
        old, old_positions = self.buffers, self.positions
        self.buffers = [t.new_empty(*t.shape[:-2], capacity, t.shape[-1]) for t in like]
        if old is not None and self.length:
            for buffer, held in zip(self.buffers, old, strict=True):
                buffer[..., : self.length, :] = held[..., : self.length, :]
        if old_positions is not None:
            self.positions = old_positions.new_zeros(old_positions.shape[0], capacity)
            self.positions[:, : self.length] = old_positions[:, : self.length]


class KVCache(GrowingState):
    """Softmax attention's decoding state: the keys and values of every token seen, in preallocated
    buffers written in place.

    ``k`` and ``v`` are (batch, n_kv_heads, capacity, d_head); slots ``0..length`` hold keys.
    Only the ``n_kv_heads`` key/value heads are stored, so GQA and MQA shrink the cache by
    n_heads / n_kv_heads. Keys are stored after rotation: a cached key never needs its position again.

    ``max_len`` is the capacity allocated at the first write (default: that write's length); a write
    past the capacity reallocates to twice the size, so give ``max_len`` when it is known.
    ``positions`` (batch, capacity) holds per-sample position ids when the writer passes them.
    An attention layer keeps one in its :class:`~zoo.parts.state.LayerState`:
    ``cache.mixer_state(KVCache)``.
    """

    @property
    def k(self) -> torch.Tensor | None:
        return None if self.buffers is None else self.buffers[0]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self.buffers is None else self.buffers[1]

    def append(
        self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new (b, g, t_new, d) keys and values after the cached ones; return views of all.

        positions: (b, t_new) position ids of the new keys, kept when given (for score biases).
        """
        keys, values = self.write(k, v, positions=positions)
        return keys, values


class SharedKV(MixerState):
    """The decoding state of a layer that reads an earlier layer's keys and values (``model.kv_share``): the
    tokens it has seen, and nothing else (its group's first layer caches the keys and values)."""

    supports_static = True

    @property
    def nbytes(self) -> int:
        return 0


#: What a qk-norm normalizes over: each head's d_head features, or all heads' features jointly (OLMo 2/3's q_norm over
#: n_heads d_head, k_norm over n_kv_heads d_head).
