"""Small text helpers every subsystem uses, kept in one place (a leaf: imports only the stdlib)."""

from __future__ import annotations

import re
from typing import Iterable

GiB = 1 << 30

# CSI sequences (colours, cursor moves), OSC sequences (titles, hyperlinks) and two-byte escapes
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def split_csv(values: Iterable) -> list[str]:
    """['a,b', 'c'] -> ['a', 'b', 'c']: repeatable, comma-separated options."""
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


def truthy(value) -> bool:
    """A YAML or environment flag as LLaMA-Factory reads it (true, 1, yes, y, on)."""
    return value is True or (isinstance(value, (str, int)) and not isinstance(value, bool)
                             and str(value).strip().lower() in ("1", "true", "yes", "y", "on"))


def one_line(text, limit: int = 400) -> str:
    """Whitespace collapsed and cut at limit characters, with an ellipsis when cut."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Secrets that logs and environments carry, masked in every output (mask_secrets is applied at
# each output boundary: explain's report and JSON, check's findings, the pytest sections).
# Each pattern keeps what identifies the kind (a prefix, the variable's name) and masks the rest.
MASK = "***"
_ENV_NAME = r"[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)|TOKEN|SECRET|PASSWORD|PASSWD"
_CONFIG_NAME = (r"(?i:(?:hf|hub|wandb|api|access|auth|bearer|refresh|secret|private|aws_session|openai|anthropic|"
                r"github|gitlab)_?(?:api_)?(?:token|key)|aws_secret_access_key|client_secret|api_secret|password|passwd)")
# the name's closing quote, if any, then ':' or '=' ('NAME= value' is an empty value in a shell)
_ASSIGNED = r"[\"']?(?:=|\s*:\s*|\s+=\s*)"
_VALUE = rf"(?!{re.escape(MASK)})(?!(?:None|null|none|true|false|\$\{{?\w+\}}?)[\s\"',;}}]|(?:None|null|none)$)" \
         r"(?:\"[^\"\n]+\"|'[^'\n]+'|[^\s\"',;}]{4,})"
_SECRETS = re.compile(
    r"(?P<k1>\b(?:hf|api_org)_)[A-Za-z0-9]{30,}"  # Hugging Face tokens
    r"|(?P<k2>(?<![A-Za-z0-9_-])sk-(?:ant-(?:api\d\d-)?|proj-|svcacct-|admin-)?)[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|(?P<k3>\b(?:AKIA|ASIA|ABIA|ACCA))[0-9A-Z]{16}\b"  # AWS access key ids
    r"|(?P<k4>\bgh[pousr]_)[A-Za-z0-9]{30,}|(?P<k5>\bgithub_pat_)[A-Za-z0-9_]{22,}"  # GitHub
    r"|(?P<k6>\bglpat-)[A-Za-z0-9_-]{20,}|(?P<k7>\bxox[abposr]-)[A-Za-z0-9-]{10,}|(?P<k8>\bAIza)[0-9A-Za-z_-]{35}"
    r"|(?P<k9>\bwandb login\s+(?:--?\S+\s+)*)[0-9a-f]{40}\b"  # wandb login KEY
    r"|(?P<k10>\b[Bb]earer\s+)[A-Za-z0-9._~+/=-]{16,}"  # Authorization: Bearer ...
    r"|(?P<k11>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@\"'<>]*:)[^\s/@\"'<>]+(?=@)"  # scheme://user:PASSWORD@host
    r"|(?P<k12>[?&;](?:token|access_token|api_key|apikey|key|sig|signature|password|secret)=)[^\s&#\"'<>]+"  # ?token=
    rf"|(?P<k13>(?<![A-Za-z0-9_])(?:{_ENV_NAME}){_ASSIGNED}){_VALUE}"  # HF_TOKEN=..., WANDB_API_KEY: ...
    rf"|(?P<k14>(?<![A-Za-z0-9_]){_CONFIG_NAME}{_ASSIGNED}){_VALUE}"  # hf_token: ..., "password": "..."
    r"|(?P<k15>--(?:hf_token|hub_token|token|api[_-]key|password|secret|auth[_-]token|access[_-]token)(?:=|\s+))"
    r"(?!-)[^\s\"']{4,}"  # --hf_token VALUE
)
# a cheap test first: a line with none of these holds no secret that the expression above finds
_SECRET_HINTS = ("hf_", "api_org_", "sk-", "AKIA", "ASIA", "ABIA", "ACCA", "gh", "github_pat_", "glpat-", "xox",
                 "AIza", "wandb", "earer", "://", "=", "TOKEN", "KEY", "SECRET", "PASS", "token", "key", "secret",
                 "passw", "--")


def _keep_prefix(m: "re.Match[str]") -> str:
    return next(g for g in m.groups() if g is not None) + MASK


def mask_secrets(text: str) -> str:
    """text with the tokens, keys and passwords it carries replaced by '***' (their kind kept:
    'hf_***', 'HF_TOKEN=***', 'https://user:***@host')."""
    if not any(h in text for h in _SECRET_HINTS):
        return text
    return _SECRETS.sub(_keep_prefix, text)


def mask_data(obj, _depth: int = 0):
    """A copy of obj with every string masked: dicts, lists, tuples and dataclass instances are
    walked (what a report is made of); str subclasses such as enum values, and everything
    else, are kept as they are."""
    if type(obj) is str:
        return mask_secrets(obj)
    if _depth > 20:
        return obj
    if isinstance(obj, dict):
        return {mask_data(k, _depth + 1): mask_data(v, _depth + 1) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(mask_data(v, _depth + 1) for v in obj)
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None and not isinstance(obj, type):
        import copy
        masked = copy.copy(obj)
        for name in fields:
            try:
                object.__setattr__(masked, name, mask_data(getattr(obj, name), _depth + 1))
            except AttributeError:
                continue  # a field without a value
        return masked
    return obj
