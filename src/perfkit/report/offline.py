"""The page makes no network request: :func:`external_refs` finds what would make a browser fetch
from the network, :func:`neutralise_external` makes it inert."""

from __future__ import annotations

import re

_ATTR_EXT = re.compile(r"""(?<![\w-])(src|href|action|poster|data)(\s*=\s*["']?\s*)((?:https?:)?//)""", re.I)
_URL_EXT = re.compile(r"""(url\(\s*["']?\s*)((?:https?:)?//)""", re.I)
_IMPORT_EXT = re.compile(r"""(@import\s+["']?)((?:https?:)?//)""", re.I)
_EXTERNAL = re.compile("|".join(p.pattern for p in (_ATTR_EXT, _URL_EXT, _IMPORT_EXT)), re.I)
_SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc\s*=[^>]*>\s*</script>", re.I)
_LINK_EXT = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", re.I)


def external_refs(text: str) -> list[str]:
    """Snippets of ``text`` that would make a browser fetch something from the network
    (``src=``/``href=``/``action=``/``poster=``/``data=`` to ``//`` or ``http(s)://``, CSS
    ``url(//…)`` and ``@import``). Empty when the page is self-contained."""
    return [text[max(0, m.start() - 40) : m.end() + 60] for m in _EXTERNAL.finditer(text)]


def neutralise_external(text: str) -> str:
    """Make network references inert: ``src="https://x"`` -> ``data-offline-src="https://x"``,
    ``url(https://x)`` -> ``url(data:,https://x)``."""
    text = _ATTR_EXT.sub(lambda m: f"data-offline-{m.group(1)}{m.group(2)}{m.group(3)}", text)
    text = _URL_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)
    return _IMPORT_EXT.sub(lambda m: f"{m.group(1)}data:,{m.group(2)}", text)


def strip_external(body: str) -> str:
    """Drop script/link elements that load from the network (belt and braces)."""
    return _LINK_EXT.sub("", _SCRIPT_SRC.sub("", body))
