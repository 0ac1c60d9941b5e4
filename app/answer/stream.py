"""One streaming rule for ask, chat and the window: the pieces shown add up to the answer returned.

Decoded tokens arrive one at a time; the text they make is not always text yet. A character split
over two tokens decodes to U+FFFD if shown token by token; a stop string ("\\nQ:", "\\nUser") arrives
over several tokens and is cut from the answer once complete; the answer is returned stripped.
`TextStream` holds back what may still change (an incomplete UTF-8 sequence, a tail that may be the
start of a stop string, trailing whitespace) and `finish` shows the rest of the answer as returned,
so the concatenation of every piece shown equals the returned text exactly.
"""

from __future__ import annotations

import codecs
import contextlib
from typing import Callable, Sequence

from kvgraft.engine.errors import Cancelled

TextFn = Callable[[str], None]  # a piece of the answer; raise Cancelled to stop decoding (app/core/progress.py)


class TextStream:
    """Wraps an `on_text(piece)` callback as the engine's `on_token(token, piece)` callback.

    A `Cancelled` raised by `on_text` passes through `on_token` to `Session.generate`, which stops and
    returns what was decoded (stop_reason "callback"). `finish` still shows the rest of that answer:
    decoding is over by then, so a `Cancelled` raised there has nothing left to stop and is dropped."""

    def __init__(self, model, on_text: TextFn | None, stops: Sequence[str] = (), strip: bool = True) -> None:
        self._model = model
        self._on_text = on_text
        self._stops = tuple(s for s in stops if s)
        self._strip = strip
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # what the tokens decode to so far (an incomplete UTF-8 tail held in the decoder)
        self.shown = ""  # what was passed to on_text: always a prefix of the answer `finish` is given

    def on_token(self, token: int, _piece: str) -> None:
        self._text += self._decoder.decode(self._model.token_bytes(token))
        text = self._text.lstrip() if self._strip else self._text
        hold = max((k for s in self._stops for k in range(1, len(s) + 1) if text.endswith(s[:k])), default=0)
        safe = text[: len(text) - hold]
        if self._strip:
            safe = safe.rstrip()
        self._emit(safe[len(self.shown) :] if len(safe) > len(self.shown) else "")

    def finish(self, answer: str) -> None:
        """Show the rest of `answer` (the text returned: cut before a stop string, stripped)."""
        if not answer.startswith(self.shown):  # a rule above was broken: never show two different answers
            raise AssertionError(f"streamed {self.shown!r}, returned {answer!r}")
        if len(answer) > len(self.shown):
            with contextlib.suppress(Cancelled):  # decoding has ended: a stop has nothing left to stop
                self._emit(answer[len(self.shown) :])

    def _emit(self, piece: str) -> None:
        self.shown += piece
        if self._on_text is not None:
            self._on_text(piece)
