"""torch's higher-order operators after a dispatch mode: the skip dynamo remembers, forgotten.

``torch.cond``, ``while_loop`` and their kin run eagerly through ``torch.compile`` of a small
wrapper in ``torch/_higher_order_ops``. Under a dispatch mode (modelprof's op counter, the state
guard's write watch) dynamo declines that wrapper's frame and, on torch 2.11, remembers the
refusal for the code object: every later eager call, outside any mode, then has dynamo compile
the dense kernel under the wrapper and fail (``Unsupported: torch.* op returned non-Tensor``), so a
model calling ``torch.cond`` could be counted but not timed. Checked: torch 2.11.0 fails without
:func:`forget_dynamo_skips`, 2.14.1 passes with or without it.

The modes call it on their outermost exit when they saw a higher-order operator: dynamo's state
of the codes it has met in ``torch/_higher_order_ops`` (torch's own code, never the user's) is
reset, as before their first use; the next eager call compiles the wrapper again.

Private torch names (to move into the compat module): ``torch._dynamo.convert_frame.input_codes``
(the code objects dynamo has met), ``torch._C._dynamo.eval_frame.reset_code``.
"""
from __future__ import annotations

import os
import sys

__all__ = ["forget_dynamo_skips"]


def forget_dynamo_skips() -> int:
    """Reset dynamo's state of every code object in ``torch/_higher_order_ops`` it has met;
    the number reset (0 where dynamo never ran or this torch lacks the hooks)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    hops = sys.modules.get("torch._higher_order_ops")
    seen = getattr(getattr(convert_frame, "input_codes", None), "seen", None)
    if not seen or hops is None:
        return 0
    hop_dir = os.path.dirname(hops.__file__) + os.sep
    try:   # (here: a torch without dynamo's C hooks imports the rest of modelprof)
        from torch._C._dynamo.eval_frame import reset_code
    except ImportError:
        return 0
    codes = [c for c in (ref() for ref in list(seen))
             if c is not None and c.co_filename.startswith(hop_dir)]
    for code in codes:
        reset_code(code)
    return len(codes)
