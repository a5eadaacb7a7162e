"""The one compatibility shim the pinned reference stack needs.

mlx-lm 0.32.2's QuantizedSwitchLinear.__call__ always passes
`global_scale=self.global_scale` to mx.gather_qmm, but the mlx 0.32.2 Python
binding has no such keyword (added in later mlx for nvfp4), so every
quantized-MoE forward raises TypeError. For affine quantization global_scale
is always None, i.e. "absent"; dropping the keyword then calls exactly the
gather_qmm kernel a compatible mlx would. Nothing numeric is replaced.

The patch is scoped to mlx_lm.models.switch_layers (a proxy of mlx.core in
that module only), applied only when the binding lacks the keyword, and
refuses a non-None global_scale.
"""

from __future__ import annotations

import types
from typing import Any

import mlx.core as mx

ACTIVE: list[str] = []
GATHER_QMM_SHIM = ("switch_layers.gather_qmm: drop global_scale=None "
                   "(mlx 0.32.2 binding lacks the keyword)")


def _binding_takes_global_scale() -> bool:
    # The nanobind docstring's first paragraph is the call signature.
    return "global_scale" in (mx.gather_qmm.__doc__ or "").split("\n\n")[0]


def _gather_qmm(*args: Any, global_scale: Any = None, **kwargs: Any) -> mx.array:
    if global_scale is not None:
        raise NotImplementedError("global_scale (nvfp4) unsupported by this mlx")
    return mx.gather_qmm(*args, **kwargs)


class _MxProxy(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


def apply() -> None:
    if ACTIVE or _binding_takes_global_scale():
        return
    from mlx_lm.models import switch_layers

    proxy = _MxProxy("mlx.core")
    proxy.gather_qmm = _gather_qmm  # type: ignore[attr-defined]
    switch_layers.mx = proxy
    ACTIVE.append(GATHER_QMM_SHIM)
