"""The one redaction of secrets in whatever is printed or written (messages, headers, reports,
records, history rows): every place that shows an endpoint URL, a history location or text a
server or a library returned goes through here.

What counts as a secret:

- a URL's userinfo (``scheme://user:PASSWORD@host``): the password, or all of it when it has
  no ``user:`` part (``https://TOKEN@host``, ``postgresql://:PASSWORD@host``). The userinfo
  ends at the *last* ``@`` that is followed by a host, so an unencoded ``@``, ``:`` or ``/``
  in a password stays inside it (and is percent-encoded before the URL is used: ``sent``).
  The price: an ``@`` in a path or query must be written ``%40``, or what precedes it is
  taken for userinfo (and hidden: never a leak);
- a query or fragment parameter whose name says so (``api_key``, ``key``, ``token``,
  ``password``, ``access_token``, ``sslpassword``... any case, see ``is_secret_name``);
- in a libpq keyword/value connection string (``host=h password=PASSWORD dbname=d``) the
  values of the same names;
- the values found that way, and an API key read from the environment, wherever they appear
  in other text: raw, JSON-escaped, Python-repr'd or percent-encoded (``Redactor``).

``display(location)`` shows one configured URL or connection string; ``Redactor.text`` cleans
free text. Both put ``***`` where the secret was.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import quote, quote_plus, unquote, unquote_plus

REDACTED = "***"

#: Parameter names whose value is a secret (compared lower-cased, ``-`` as ``_``).
SECRET_NAMES = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "pwd",
        "sslpassword",
        "key",
        "api_key",
        "apikey",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "auth_token",
        "authorization",
        "secret",
        "client_secret",
        "sig",
        "signature",
        "credential",
        "credentials",
        "jwt",
        "session",
        "sessionid",
        "private_key",
    }
)
#: ... and any name ending so (``x_amz_security_token``, ``openai_api_key``, ``db_password``).
SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "_key", "apikey")

#: Known secrets shorter than this are redacted where they stand in a URL or connection
#: string, not wherever their characters occur in other text (that would mangle every line).
MIN_SECRET_CHARS = 4

#: libpq's connection keywords (https://www.postgresql.org/docs/current/libpq-connect.html):
#: a value made of ``keyword=value`` pairs with one of these is a PostgreSQL connection string.
LIBPQ_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "service",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslrootcert",
        "sslcrl",
        "requiressl",
        "gssencmode",
        "krbsrvname",
        "target_session_attrs",
        "load_balance_hosts",
        "channel_binding",
        "require_auth",
        "sslnegotiation",
    }
)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_HOST = re.compile(r"[A-Za-z0-9._~%\-\[\]:,]*")  # host[:port], IPv6 in brackets, libpq's h1,h2 lists
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_DSN_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z_]+)\s*=\s*")
_DSN_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'?")
#: ``password=...`` (``sslpassword``, ``api_key``, ``access_token``...) in any text: the value
#: quoted or up to a space or ``&``.
_SECRET_PAIR_IN_TEXT = re.compile(
    r"(?i)\b(\w*(?:password|passwd|token|secret|api_?key))(\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;,'\"]+)"
)


def is_secret_name(name: str) -> bool:
    """A query parameter or connection keyword whose value must not be shown."""
    key = unquote_plus(name).strip().lower().replace("-", "_")
    return key in SECRET_NAMES or key.endswith(SECRET_SUFFIXES)


@dataclass(frozen=True)
class Url:
    """A URL in parts, cut robustly: ``userinfo`` ends at the last ``@`` followed by a host."""

    scheme: str  # with "://"
    userinfo: str | None
    host: str
    path: str  # from the first "/" after the host, up to the query
    query: str | None  # without "?"
    fragment: str | None  # without "#"

    @classmethod
    def split(cls, url: str) -> Url | None:
        m = _SCHEME.match(url)
        if m is None:
            return None
        scheme, rest = m.group(0), url[m.end() :]
        userinfo = None
        for at in reversed([i for i, c in enumerate(rest) if c == "@"]):
            host = re.split(r"[/?#]", rest[at + 1 :], maxsplit=1)[0]
            if _HOST.fullmatch(host):
                userinfo, rest = rest[:at], rest[at + 1 :]
                break
        end = min((i for i in map(rest.find, "/?#") if i != -1), default=len(rest))
        host, rest = rest[:end], rest[end:]
        rest, hashed, fragment = rest.partition("#")
        path, asked, query = rest.partition("?")
        return cls(scheme, userinfo, host, path, query if asked else None, fragment if hashed else None)

    def __str__(self) -> str:
        u, q, f = self.userinfo, self.query, self.fragment
        return (
            f"{self.scheme}{'' if u is None else u + '@'}{self.host}{self.path}"
            f"{'' if q is None else '?' + q}{'' if f is None else '#' + f}"
        )

    def shown(self) -> str:
        """As it may be printed: the userinfo's secret and secret parameters as ``***``."""
        return str(
            replace(
                self,
                userinfo=self.shown_userinfo(),
                query=None if self.query is None else _redact_params(self.query),
                fragment=None if self.fragment is None else _redact_params(self.fragment),
            )
        )

    def _secret_user(self) -> bool:
        """A user without a password is a credential (``https://TOKEN@host``), except in a
        PostgreSQL URL, where it is the role's name."""
        return not self.scheme.lower().startswith("postgres")

    def userinfo_secrets(self) -> list[str]:
        user, _, password = (self.userinfo or "").partition(":")
        if password:
            return [password]
        return [user] if user and self._secret_user() else []

    def shown_userinfo(self) -> str | None:
        if self.userinfo is None:
            return None
        user, colon, password = self.userinfo.partition(":")
        if password:
            return f"{user}:{REDACTED}"
        return REDACTED + colon if user and self._secret_user() else self.userinfo

    def at(self, path: str) -> Url:
        """The same URL with ``path`` (the query kept after it) and no fragment (never sent)."""
        return replace(self, path=path, fragment=None)

    def sent(self) -> str:
        """What a client is given: the userinfo percent-encoded (``normalized``)."""
        return str(self.normalized())

    def normalized(self) -> Url:
        """The URL with its userinfo percent-encoded, as the user meant it (an unencoded
        ``@``, ``:`` or ``/`` in a password would otherwise move the host for libpq or httpx)."""
        if self.userinfo is None:
            return self
        user, colon, password = self.userinfo.partition(":")
        return replace(
            self, userinfo=quote(unquote(user), safe="") + (colon and ":" + quote(unquote(password), safe=""))
        )

    def secret_params(self) -> list[str]:
        return [value for part in (self.query, self.fragment) if part for _, value, secret in _params(part) if secret]


def _params(text: str) -> list[tuple[str, str, bool]]:
    """``a=1&b=2`` as (name, value, is secret); a part without ``=`` has the value ""."""
    pairs = (piece.partition("=") for piece in re.split(r"[&;]", text))
    return [(name, value, bool(value) and is_secret_name(name)) for name, _, value in pairs]


def _redact_params(text: str) -> str:
    return re.sub(
        r"(^|[&;])([^&;=]+)=([^&;]*)",
        lambda m: (
            f"{m.group(1)}{m.group(2)}={REDACTED}"
            if m.group(3) and is_secret_name(m.group(2)) and not m.group(3).startswith(REDACTED)
            else m.group(0)
        ),
        text,
    )


def _dsn_pairs(text: str) -> list[tuple[str, int, int]]:
    """(keyword, start, end of its value) of each ``keyword=value`` pair. A value runs to the
    next pair, past its closing quote if it has one: what libpq would refuse there (a space in
    an unquoted password) stays inside the value, hidden with it."""
    out, pos = [], 0
    while (m := _DSN_KEY.search(text, pos)) is not None:
        start = end = m.end()
        if text.startswith("'", start):
            quoted = _DSN_QUOTED.match(text, start)
            assert quoted is not None  # a quote starts it, and the closing quote is optional
            end = quoted.end()
        following = _DSN_KEY.search(text, end)
        end = max(end, following.start() if following else len(text))
        while end > start and text[end - 1].isspace():
            end -= 1
        out.append((m.group(1), start, end))
        pos = max(end, start + 1) if following is None or following.start() >= end else following.start()
    return out


def is_dsn(text: str) -> bool:
    """A libpq keyword/value connection string (``host=h dbname=d password=p``): it starts
    with ``keyword=`` and names at least one of libpq's keywords."""
    if not re.match(r"\s*[A-Za-z_]+\s*=", text):
        return False
    return any(name.lower() in LIBPQ_KEYWORDS for name, _, _ in _dsn_pairs(text))


def _dsn_secrets(text: str) -> list[str]:
    out = []
    for name, start, end in _dsn_pairs(text):
        value = text[start:end]
        if value and is_secret_name(name):
            out.append(value)
            if value.startswith("'"):
                out.append(re.sub(r"\\(.)", r"\1", value.strip("'")))
    return out


def _redact_dsn(text: str) -> str:
    for name, start, end in reversed(_dsn_pairs(text)):
        if end > start and is_secret_name(name):
            text = text[:start] + REDACTED + text[end:]
    return text


def display(location: str) -> str:
    """One configured URL or connection string as it may be shown: secrets replaced by ``***``
    (a value that is neither comes back as it is)."""
    url = Url.split(location)
    if url is not None:
        return url.shown()
    if is_dsn(location):
        return _redact_dsn(location)
    return location


def secrets_in(location: str) -> tuple[str, ...]:
    """The secret values one URL or connection string holds: as written, decoded, the pieces
    a parser may show of a broken one, and (a URL's userinfo) as a Basic Authorization header
    carries it."""
    url = Url.split(location)
    whole: list[str] = []
    if url is not None:
        found = url.userinfo_secrets() + url.secret_params()
        whole = _userinfo_forms(url.userinfo or "") if url.userinfo_secrets() else []
    elif is_dsn(location):
        found = _dsn_secrets(location)
    else:
        return ()
    return _decoded_and_pieces(found, whole)


def _decoded_and_pieces(found: Sequence[str], whole: Sequence[str]) -> tuple[str, ...]:
    """Each secret as written and decoded, the pieces a parser may show of a broken value, then
    ``whole`` (the userinfo's forms): each once, in that order."""
    decoded = [f for v in found for f in (v, unquote(v), unquote_plus(v))]
    pieces = [p for v in decoded for p in re.split(r"[\s@:/']+", v)]
    return tuple(dict.fromkeys(f for f in decoded + pieces + list(whole) if f))


def _userinfo_forms(info: str) -> list[str]:
    """A URL's whole userinfo as written, decoded, and as a Basic Authorization header carries it."""
    return [info, unquote(info), base64.b64encode(unquote(info).encode()).decode()]


def forms(secret: str) -> set[str]:
    """The ways a secret shows up in text: raw, JSON-escaped, repr'd, percent-encoded."""
    out = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        quote(secret, safe="@:/"),
    }
    out |= {f.lower() for f in out if "%" in f}  # %2f as well as %2F
    return {f for f in out if f}


@dataclass(frozen=True)
class Redactor:
    """Cleans free text of known secrets (every form of each) and of whatever URL or
    ``password=`` pair it contains. ``Redactor.of(locations, keys)``: the secrets of the
    configured URLs / connection strings plus raw ones (an API key)."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, locations: Iterable[str | None] = (), keys: Iterable[str | None] = ()) -> Redactor:
        found = [s for loc in locations if loc for s in secrets_in(loc)] + [k for k in keys if k]
        every = {f for s in found if len(s) >= MIN_SECRET_CHARS for f in forms(s)}
        return cls(tuple(sorted(every, key=lambda f: (-len(f), f))))

    def text(self, text: str) -> str:
        """URLs shown (``user:***@``), ``password=`` pairs hidden, then every known secret."""
        text = _URL_IN_TEXT.sub(_display_in_text, text)
        text = _SECRET_PAIR_IN_TEXT.sub(
            lambda m: (
                f"{m.group(1)}{m.group(2)}{REDACTED}"
                if not m.group(3).strip("'\"").startswith(REDACTED)
                else m.group(0)
            ),
            text,
        )
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    __call__ = text


def _display_in_text(m: re.Match[str]) -> str:
    """A URL found in text, shown; the punctuation after it (``:``, ``)``, ``.``) is no part of it."""
    url = m.group(0)
    tail = re.search(r"[.,;:!?)\]}]*$", url)
    assert tail is not None  # the pattern matches the empty string at the end
    return display(url[: tail.start()]) + tail.group(0)


def redact(text: str) -> str:
    """Free text with no known secret: URLs and ``password=`` pairs in it redacted."""
    return Redactor().text(text)
