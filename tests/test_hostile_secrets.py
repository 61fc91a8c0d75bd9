"""Secrets in URLs and connection strings, one row per form we accept (issue 21, class 2).

An endpoint URL may carry a password (``http://user:PW@host``), a token as its user
(``http://TOKEN@host``) or a key in its query (``?api_key=KEY``); a history location may be a
``postgresql://`` URL (an empty user, an unencoded ``@``/``:``/``/`` in the password) or libpq's
``host=... password=...`` form; the API key comes from the environment. Every row runs a real
inner pytest session (or the ``llmperf`` command) against our server on 127.0.0.1 (which
answers only a request carrying the right credentials, and echoes what it got when they are
wrong, as a careless server does) or a real PostgreSQL (tests/pgserver.py), and asserts:
the exact one line, printed once; the exit status; no traceback; a bounded time; and that no
secret is anywhere in stdout/stderr or in any file the run left under its tmp folder (JUnit
XML, the JSON session file, the Markdown summary, the SQLite history), nor in the PostgreSQL
history's rows, nor in any file's name. Every secret holds ``CORE``, so one scan finds it raw,
percent-encoded or JSON-escaped; the Basic Authorization header's base64 is scanned too.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from fakeserver import serving
from inner import run
from pgserver import PgServer, bindir, unavailable
from test_hostile import STOP, WORKLOAD, Hostile, source

from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.core.redact import Redactor, display, is_dsn, secrets_in

try:  # imported here, before any pytester snapshot of sys.modules: a psycopg imported inside
    import psycopg  # an inner session and dropped after it leaves its C extension raising the
except ImportError:  # old module's exception classes, which the next import no longer catches
    psycopg = None

CORE = "Zq7Kx9wQ"
PW = f"{CORE}-pw"
KEY = f"{CORE}-key"
RAW_PW = f"{CORE}@a/b:{CORE}"  # unencoded '@', '/' and ':' in a password
TOKEN = f"{CORE}-token"
ENV_KEY = f'{CORE}/"k y+1'  # JSON-escapes and percent-encodes differently
NON_ASCII_KEY = f"{CORE}-ключ"

#: What our server lets through: the request's Authorization header and query (set per case).
EXPECTED: dict[str, str] = {}


def basic(userinfo: str) -> str:
    return "Basic " + base64.b64encode(userinfo.encode()).decode()


class Guarded(Hostile):
    """``/<fault>/v1/completions?<query>``: served as ``Hostile`` serves the fault when the
    Authorization header and the query are the expected ones; otherwise 401 with the path,
    query and Authorization header echoed back. ``echo_forms``: 401 echoing the Bearer key
    raw, percent-encoded and JSON-escaped."""

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        auth = self.headers.get("Authorization") or ""
        fault = path.strip("/").split("/")[0]
        if fault != "echo_forms" and path.endswith("/v1/completions") and EXPECTED == {"auth": auth, "query": query}:
            return super().do_POST()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = auth.removeprefix("Bearer ")
        message = (
            f"seen {quote(key, safe='')} and {quote_plus(key)} and {auth}"
            if fault == "echo_forms"
            else f"refused {self.path} with {auth}"
        )
        payload = json.dumps({"error": {"message": message}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def host() -> str:
    """``127.0.0.1:PORT`` of our guarded server."""
    with serving(Guarded, STOP) as url:
        yield url.removeprefix("http://")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pg() -> PgServer:
    if bindir() is None or psycopg is None:
        unavailable()
    with PgServer() as server:
        yield server


def needs_psycopg() -> None:
    if psycopg is None:
        unavailable()


# -- the checks every row makes -----------------------------------------------------------------


def leaks(text: str | bytes) -> list[str]:
    """The needles found: ``CORE`` in any form, a Basic header's base64 of a secret userinfo."""
    data = text.encode() if isinstance(text, str) else text
    needles = [CORE, *(base64.b64encode(u.encode()).decode() for u in (f"bench:{PW}", f"bench:{RAW_PW}", f"{TOKEN}:"))]
    return [n for n in needles if n.encode() in data]


#: The files a session that measured leaves (the SQLite history: the default location).
MEASURED = ("junit.xml", "session.json", "summary.md", "history.sqlite")
FAILED = ("junit.xml", "session.json")  # no measurement: no Markdown row, no history


def assert_no_secret(root: Path, output: str, scanned: tuple[str, ...] = ()) -> None:
    """No secret in ``output``, in any file under ``root`` or in a file's name; ``scanned``:
    files that must be among those read."""
    assert not leaks(output), output
    files = [p for p in root.rglob("*") if p.is_file()]
    assert set(scanned) <= {p.name for p in files}
    assert not [str(p) for p in files if leaks(p.read_bytes()) or CORE in str(p)]
    assert not [str(p) for p in root.rglob(f"*{CORE}*")]  # no file or folder named with a secret


def assert_one_line(output: str, line: str) -> None:
    """``line`` (an fnmatch pattern where it holds ``*``) is one whole line of ``output``, once."""
    assert "\n" not in line
    found = [x for x in output.splitlines() if fnmatch.fnmatchcase(x.strip(), line) or x.strip().endswith(line)]
    assert len(found) == 1, output
    if "*" not in line:
        assert output.count(line) == 1, output
    assert "Traceback" not in output and "During handling of the above exception" not in output, output


# -- inner sessions: endpoints --------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One endpoint form: {host} is our server, {closed} a port nobody listens on; ``auth`` and
    ``query`` are what the server must receive for the ``ok`` fault to be served."""

    id: str
    endpoint: str
    message: str
    exit: int
    auth: str = ""
    query: str = ""
    env_key: str | None = KEY
    seconds: float = 60.0  # no wait without its deadline; a measured session at load 10 took 30 s


HEADER = "llmperf: endpoint {shown} (completions), model (server default)"
CASES = [
    Case(
        "userinfo-and-api-key-query",
        f"http://bench:{PW}@{{host}}/ok/v1?api_key={KEY}",
        HEADER.format(shown="http://bench:***@{host}/ok/v1?api_key=***"),
        0,
        auth=basic(f"bench:{PW}"),
        query=f"api_key={KEY}",
    ),
    Case(
        "query-survives-the-path",
        f"http://{{host}}/ok/v1/?Token={KEY}&mode=fast",
        HEADER.format(shown="http://{host}/ok/v1/?Token=***&mode=fast"),
        0,
        auth=f"Bearer {KEY}",
        query=f"Token={KEY}&mode=fast",
    ),
    Case(
        "unencoded-at-slash-colon-in-password",
        f"http://bench:{RAW_PW}@{{host}}/ok/v1",
        HEADER.format(shown="http://bench:***@{host}/ok/v1"),
        0,
        auth=basic(f"bench:{RAW_PW}"),
    ),
    Case(
        "token-as-user",
        f"http://{TOKEN}@{{host}}/ok/v1",
        HEADER.format(shown="http://***@{host}/ok/v1"),
        0,
        auth=basic(f"{TOKEN}:"),
    ),
    Case(
        "wrong-credentials-echoed",
        f"http://bench:{PW}@{{host}}/ok/v1?access_token={KEY}",
        "HTTP 401 from http://bench:***@{host}/ok/v1/completions?access_token=***: "
        '{{"error": {{"message": "refused /ok/v1/completions?access_token=*** with Basic ***"}}}}',
        1,
        auth="wrong",
        query="wrong",
    ),
    Case(
        "env-key-echoed-encoded-and-escaped",
        "http://{host}/echo_forms/v1",
        "HTTP 401 from http://{host}/echo_forms/v1/completions: "
        '{{"error": {{"message": "seen *** and *** and Bearer ***"}}}}',
        1,
        env_key=ENV_KEY,
    ),
    Case(
        "connection-refused-with-secrets",
        f"http://bench:{PW}@127.0.0.1:{{closed}}/v1?key={KEY}",
        "cannot connect to http://bench:***@127.0.0.1:{closed}/v1/completions?key=*** "
        "([Errno 111] Connection refused); is the server running?",
        1,
        seconds=20,
    ),
    Case(
        "non-ascii-api-key",
        "http://{host}/ok/v1",
        "$LLMPERF_API_KEY holds a character at position 10 that an HTTP header cannot carry (ASCII letters, "
        "digits and punctuation only); set it to the key exactly as issued",
        1,
        env_key=NON_ASCII_KEY,
        seconds=20,
    ),
]

REPORTS = ("--junitxml=junit.xml", "--llmperf-json=session.json", "--llmperf-markdown=summary.md")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_endpoint_secret(pytester: pytest.Pytester, host: str, monkeypatch: pytest.MonkeyPatch, case: Case):
    names = {"host": host, "closed": closed_port()}
    if case.env_key is None:
        monkeypatch.delenv("LLMPERF_API_KEY", raising=False)
    else:
        monkeypatch.setenv("LLMPERF_API_KEY", case.env_key)
    EXPECTED.clear()
    EXPECTED.update(auth=case.auth, query=case.query)
    pytester.makepyfile(test_inner=source(WORKLOAD))
    started = time.monotonic()
    result = run(
        pytester,
        f"--llmperf-endpoint={case.endpoint.format(**names)}",
        "--llmperf-baseline-dir=baselines",
        "-rN",
        *REPORTS,
    )
    elapsed = time.monotonic() - started
    output = result.stdout.str() + result.stderr.str()
    assert elapsed < case.seconds, f"took {elapsed:.1f} s"
    assert result.ret == case.exit, output
    assert_one_line(output, case.message.format(**names))
    if case.exit == 0:  # the server saw the credentials: the query was kept, the userinfo decoded
        result.assert_outcomes(passed=1)
    assert_no_secret(pytester.path, output, MEASURED if case.exit == 0 else FAILED)


# -- an A/B side given as a URL ------------------------------------------------------------------

AB_SOURCE = """
def test_ab(llmperf):
    llmperf.compare(a={url!r}, b={url!r}, runs=3, warmup=0, prompt_tokens=4, max_tokens=8)
"""


@pytest.mark.parametrize(
    ("auth", "code", "line"),
    [
        (basic(f"bench:{PW}"), 0, None),
        (
            "wrong",
            1,
            "HTTP 401 from http://bench:***@{host}/ok/v1/completions?api_key=***: "
            '{{"error": {{"message": "refused /ok/v1/completions?api_key=*** with Basic ***"}}}}',
        ),
    ],
    ids=["served", "refused"],
)
def test_ab_side_url(
    pytester: pytest.Pytester, host: str, monkeypatch: pytest.MonkeyPatch, auth: str, code: int, line: str | None
) -> None:
    """A side's name is the URL as shown, in the session file as in every line."""
    monkeypatch.setenv("LLMPERF_API_KEY", KEY)
    EXPECTED.clear()
    EXPECTED.update(auth=auth, query=f"api_key={KEY}")
    url = f"http://bench:{PW}@{host}/ok/v1?api_key={KEY}"
    pytester.makepyfile(test_inner=AB_SOURCE.format(url=url))
    started = time.monotonic()
    result = run(pytester, "-rN", *REPORTS)
    output = result.stdout.str() + result.stderr.str()
    assert time.monotonic() - started < 30
    assert result.ret == code, output
    if line is None:
        (ab,) = json.loads((pytester.path / "session.json").read_text())["ab"]
        assert ab["a"]["name"] == ab["b"]["name"] == f"http://bench:***@{host}/ok/v1?api_key=***"
        assert "Traceback" not in output
    else:
        assert_one_line(output, line.format(host=host))
    (pytester.path / "test_inner.py").unlink()  # the one file that holds the secret: the test we wrote
    assert_no_secret(pytester.path, output, FAILED)


# -- the llmperf load command ---------------------------------------------------------------------

LOAD = ("--concurrency", "1", "--requests", "2", "--warmup", "0", "--prompt-tokens", "4", "--max-tokens", "4")


@pytest.mark.parametrize(
    ("name", "auth", "code", "line"),
    [
        (
            "served",
            basic(f"bench:{PW}"),
            0,
            "llmperf load: 2 requests per level (closed loop, +0 warm-up), 4-word prompts, 4 tokens each; "
            "completions at http://bench:***@{host}/ok/v1?api_key=***",
        ),
        (
            "refused",
            "wrong",
            2,
            "llmperf: error: all 2 requests failed; first: HTTP 401 from http://bench:***@{host}/ok/v1/completions"
            '?api_key=***: {{"error": {{"message": "refused /ok/v1/completions?api_key=*** with Basic ***"}}}}',
        ),
    ],
    ids=["served", "refused"],
)  # ids of our own: a parameter's base64 would put the secret in the id
def test_load_command(
    host: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    auth: str,
    code: int,
    line: str,
) -> None:
    monkeypatch.setenv("LLMPERF_API_KEY", KEY)
    monkeypatch.setenv("COLUMNS", "1000")  # the line whole (at 80 columns it wraps)
    monkeypatch.chdir(tmp_path)
    EXPECTED.clear()
    EXPECTED.update(auth=auth, query=f"api_key={KEY}")
    started = time.monotonic()
    assert cli_main(["load", "--endpoint", f"http://bench:{PW}@{host}/ok/v1?api_key={KEY}", *LOAD]) == code
    assert time.monotonic() - started < 20
    out, err = capsys.readouterr()
    assert_one_line(out + err, line.format(host=host))
    assert_no_secret(tmp_path, out + err)


# -- inner sessions: history locations ------------------------------------------------------------


@dataclass(frozen=True)
class HistoryCase:
    """One history location: {port} and {db} are a real PostgreSQL's (``pg``: needs one),
    {closed} a port nobody listens on."""

    id: str
    location: str
    message: str
    pg: bool = True
    written: bool = True
    extra: dict = field(default_factory=dict)


APPENDED = "llmperf: history: session #1 (1 measurement(s)) appended to {shown}"
NOT_WRITTEN = "llmperf: history not written: cannot connect to the history {shown}: "
HISTORY_CASES = [
    HistoryCase(
        "pg-url-empty-user",
        f"postgresql://:{PW}@127.0.0.1:{{port}}/{{db}}?user=llmperf",
        APPENDED.format(shown="postgresql://:***@127.0.0.1:{port}/{db}?user=llmperf"),
    ),
    HistoryCase(
        "pg-url-unencoded-password",
        f"postgresql://llmperf:{RAW_PW}@127.0.0.1:{{port}}/{{db}}",
        APPENDED.format(shown="postgresql://llmperf:***@127.0.0.1:{port}/{db}"),
    ),
    HistoryCase(
        "pg-url-password-parameter",
        f"postgresql://llmperf@127.0.0.1:{{port}}/{{db}}?password={PW}",
        APPENDED.format(shown="postgresql://llmperf@127.0.0.1:{port}/{db}?password=***"),
    ),
    HistoryCase(
        "libpq-keywords",
        f"host=127.0.0.1 port={{port}} dbname={{db}} user=llmperf password={PW}",
        APPENDED.format(shown="host=127.0.0.1 port={port} dbname={db} user=llmperf password=***"),
    ),
    HistoryCase(
        "libpq-keywords-quoted-password",
        f"host=127.0.0.1 port={{port}} dbname={{db}} user=llmperf password='{CORE} it\\'s'",
        APPENDED.format(shown="host=127.0.0.1 port={port} dbname={db} user=llmperf password=***"),
    ),
    HistoryCase(
        "pg-unknown-role",
        f"postgresql://ghost:{PW}@127.0.0.1:{{port}}/{{db}}",
        NOT_WRITTEN.format(shown="postgresql://ghost:***@127.0.0.1:{port}/{db}")
        + '*role "ghost" does not exist; fix the user in the URL, or create that role; the verdicts used the '
        "baseline files alone",
        written=False,
    ),
    # A broken keyword string is refused before anything runs: tests/test_path_options.py.
]


def pg_rows(url: str) -> str:
    """Every row of the history's tables, as text."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'llmperf_%'")]
        return "\n".join(str(row) for t in tables for row in conn.execute(f"SELECT * FROM {t}"))


@pytest.mark.parametrize("case", HISTORY_CASES, ids=[c.id for c in HISTORY_CASES])
def test_history_secret(
    pytester: pytest.Pytester,
    host: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    case: HistoryCase,
) -> None:
    needs_psycopg()
    names: dict = {"closed": closed_port()}
    url = None
    if case.pg:
        server: PgServer = request.getfixturevalue("pg")
        url = server.new_database()
        names.update(port=server.port, db=url.rsplit("/", 1)[1])
    monkeypatch.setenv("LLMPERF_API_KEY", KEY)
    EXPECTED.clear()
    EXPECTED.update(auth=f"Bearer {KEY}", query="")
    pytester.makepyfile(test_inner=source(WORKLOAD))
    started = time.monotonic()
    result = run(
        pytester,
        f"--llmperf-endpoint=http://{host}/ok/v1",
        f"--llmperf-history={case.location.format(**names)}",
        "--llmperf-baseline-dir=baselines",
        "-rN",
        *REPORTS,
    )
    output = result.stdout.str() + result.stderr.str()
    assert time.monotonic() - started < 30
    assert result.ret == 0, output  # a history not written costs its line, never the session
    assert_one_line(output, case.message.format(**names))
    assert_no_secret(pytester.path, output, MEASURED[:3])
    if url is not None:
        rows = pg_rows(url)
        assert bool(rows) == case.written and not leaks(rows)


# -- the llmperf history command ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "line"),
    [
        (
            f"postgresql://ghost:{RAW_PW}@127.0.0.1:{{closed}}/db",
            "llmperf: error: cannot connect to the history postgresql://ghost:***@127.0.0.1:{closed}/db: *",
        ),
        (
            f"host=127.0.0.1 port={{closed}} password={CORE}a {CORE}b",
            "llmperf: error: --history: 'host=127.0.0.1 port={closed} password=***' is not a valid PostgreSQL "
            'location (missing "=" after "***" in connection info string); give e.g. '
            "postgresql://user@host:5432/db or host=... dbname=...",
        ),
    ],
    ids=["pg-url", "libpq-keywords"],
)
def test_history_command(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, location: str, line: str
) -> None:
    needs_psycopg()
    monkeypatch.chdir(tmp_path)
    closed = closed_port()
    started = time.monotonic()
    assert cli_main(["history", "--history", location.format(closed=closed)]) == 2
    assert time.monotonic() - started < 20
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and not out, out + err
    assert_one_line(err, line.format(closed=closed))
    assert_no_secret(tmp_path, out + err)


# -- the one redaction, form by form --------------------------------------------------------------

FORMS = [
    # (configured value, as shown, its secrets must be among secrets_in)
    (f"http://user:{PW}@h:8000/v1?api_key={KEY}", "http://user:***@h:8000/v1?api_key=***", [PW, KEY]),
    (f"http://user@h/v1?password={PW}", "http://***@h/v1?password=***", [PW]),
    (f"https://{TOKEN}@h/v1", "https://***@h/v1", [TOKEN]),
    (f"https://{TOKEN}:@h/v1", "https://***:@h/v1", [TOKEN]),
    (f"postgresql://:{PW}@h/db?user=u", "postgresql://:***@h/db?user=u", [PW]),
    (f"postgresql://u:{RAW_PW}@h:5432/db", "postgresql://u:***@h:5432/db", [RAW_PW]),
    (f"postgres://u:{quote(RAW_PW, safe='')}@h1:5432,h2:5433/db", "postgres://u:***@h1:5432,h2:5433/db", [RAW_PW]),
    ("postgresql://llmperf@127.0.0.1:5432/db", "postgresql://llmperf@127.0.0.1:5432/db", []),
    (
        f"http://h/v1?X-Api-Key={KEY}&sslpassword={PW}&SIG={KEY}&n=1#access_token={TOKEN}",
        "http://h/v1?X-Api-Key=***&sslpassword=***&SIG=***&n=1#access_token=***",
        [KEY, PW, TOKEN],
    ),
    (f"host=h port=5 dbname=d user=u password={PW}", "host=h port=5 dbname=d user=u password=***", [PW]),
    (f"host=h password = '{CORE} it\\'s' sslpassword={KEY}", "host=h password = *** sslpassword=***", [KEY]),
    ("history.sqlite", "history.sqlite", []),
    ("./runs=3/history.sqlite", "./runs=3/history.sqlite", []),
]


@pytest.mark.parametrize(("value", "shown", "secrets"), FORMS, ids=[f[1] for f in FORMS])
def test_every_form_is_shown_without_its_secret(value: str, shown: str, secrets: list[str]) -> None:
    assert display(value) == shown and display(shown) == shown
    assert set(secrets) <= set(secrets_in(value))
    assert is_dsn(value) == value.startswith("host=")
    redactor = Redactor.of([value], [ENV_KEY])
    for secret in [*secrets, ENV_KEY]:
        for text in (secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret), repr(secret)):
            assert not leaks(redactor.text(f"echo {text} and {value}")), redactor.text(text)


def test_a_keyword_string_is_never_a_sqlite_path(tmp_path: Path) -> None:
    from pytest_llmperf.history.connection import parse

    needs_psycopg()
    loc = parse(f"host=127.0.0.1 dbname=d password={PW}", "--llmperf-history", tmp_path)
    assert loc is not None and loc.kind == "postgresql" and PW not in loc.display
    assert parse("runs=3.sqlite", "x", tmp_path).kind == "sqlite"  # not libpq's keywords: a file name


def test_the_endpoint_query_stays_after_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_llmperf.engines.http import HttpEngine

    monkeypatch.delenv("LLMPERF_API_KEY", raising=False)
    engine = HttpEngine(f"http://u:{RAW_PW}@h:1/v1/?api_key={KEY}#frag", api="chat")
    assert engine.url == "http://u:***@h:1/v1/chat/completions?api_key=***"
    assert engine.endpoint == "http://u:***@h:1/v1?api_key=***"
    assert CORE not in repr(engine) + str(engine.info())
    assert HttpEngine(f"http://h:1?key={KEY}").url == "http://h:1/v1/completions?key=***"
    run_id = uuid.uuid4().hex  # a key-free URL is shown as given
    assert HttpEngine(f"http://h:1/{run_id}/v1").url == f"http://h:1/{run_id}/v1/completions"
