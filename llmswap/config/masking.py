"""Secret-looking values in a command line, masked for display (`/running`, logs, `check-config`).

What is shown of a model's command is first its written form (`${env.NAME}` references kept, see
`envsubst.mark_env`); this masks what was typed in literally on top of that: the value after a flag whose
last word is key, token, secret, password... (`--api-key X`, `--hf-token=X`), an assignment to such a name
(`HF_TOKEN=X`, `-e OPENAI_API_KEY=X`), the credentials of an `Authorization:`/`X-Api-Key:` header, and the
password of a URL (`https://user:X@host`). A `${env.NAME}` reference is never masked: it is no secret.
"""

from __future__ import annotations

import re

MASK = "***"

# The last word of a flag or variable name that marks its value as a secret.
_SECRET_WORDS = "key|apikey|token|secret|password|passwd|pass|pwd|credential|credentials|auth"
# One shell word: quoted, or a run of non-space characters.
_VALUE = r"""(?:'[^']*'|"(?:\\.|[^"\\])*"|[^\s'"]+)"""
_ENV_REFERENCE = re.compile(r"""^["']?\$\{env\.[A-Za-z_][A-Za-z0-9_]*\}["']?$""")

_FLAG = re.compile(
    rf"(?<![\w-])(--?(?:[A-Za-z0-9]+[-_])*(?:{_SECRET_WORDS}))(=|\s+)(?!-)({_VALUE})", re.IGNORECASE
)
_ASSIGNMENT = re.compile(
    rf"(?<![\w.-])((?:[A-Za-z0-9]+_)*(?:{_SECRET_WORDS}))=({_VALUE})", re.IGNORECASE
)
_HEADER = re.compile(
    r"\b((?:proxy-)?authorization|x-api-key|api-key)(\s*:\s*)((?:bearer|basic|token)\s+)?([^\s'\"]+)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]+:)([^\s@'\"/]+)(@)", re.IGNORECASE)


def _keep_references(value: str) -> str:
    return value if _ENV_REFERENCE.match(value) else MASK


def mask_secrets(text: str) -> str:
    """`text` with every secret-looking value replaced by `***`."""
    text = _HEADER.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) or "") + _keep_references(m.group(4)),
                       text)
    text = _FLAG.sub(lambda m: m.group(1) + m.group(2) + _keep_references(m.group(3)), text)
    text = _ASSIGNMENT.sub(lambda m: m.group(1) + "=" + _keep_references(m.group(2)), text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + _keep_references(m.group(2)) + m.group(3), text)
