"""The store's password never reaches an output: a secret planted in every URL form, every output scanned.

Outputs: ``show``, ``show --json``, ``doctor``, ``doctor --json``, ``explain``, ``plugins``, the error line of a
refused URL, ``profile()``'s exception, every log record (warnings of a store that fails, errors), and
``warnings.warn`` texts; against a real server (which has no password, so each authenticated form fails
its AUTH: a client error that must not quote the password either) and against a port nobody listens on.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any
from urllib.parse import quote

import pytest

import hwprofile
from hwprofile import _remote, _storeurl
from hwprofile._redact import MASK, redact, remember, secrets_of_url
from hwprofile.cli import main
from hwprofile.errors import HwprofileError

from .conftest import Server, free_port

SECRET = "Zq7Secr3tW"
RAW = "Se/cr3t+Zq?"  # base64-ish: a raw '/' (and '?', '+') in the password
ENCODED_PLAIN = "p@ss/w0rd:Zq"  # written percent-encoded in the URL


def forms(hostport: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Form name -> (URL, the secrets that must never appear)."""
    enc = quote(ENCODED_PLAIN, safe="")
    return {
        "colon-at": (f"redis://:{SECRET}@{hostport}/0", (SECRET,)),
        "user-colon-at": (f"redis://default:{SECRET}@{hostport}/0", (SECRET,)),
        "query": (f"redis://{hostport}/0?password={SECRET}", (SECRET,)),
        "query-and-db": (f"redis://{hostport}?db=0&password={SECRET}", (SECRET,)),
        "raw-slash": (f"redis://:{RAW}@{hostport}/0", (RAW, "cr3t+Zq", "Se/cr3t")),
        "percent-encoded": (f"redis://:{enc}@{hostport}/0", (enc, ENCODED_PLAIN)),
        "tls": (f"rediss://:{SECRET}@{hostport}/0", (SECRET,)),
        "unix": (f"unix:///tmp/hwprofile-no-such-{free_port()}.sock?password={SECRET}", (SECRET,)),
        "user-only": (f"redis://{SECRET}@{hostport}/0", (SECRET,)),
    }


def every_output(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    """Run every printer and path that can quote HWPROFILE_REMOTE; return all they wrote."""
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with caplog.at_level(logging.DEBUG):
            for argv in (["show"], ["show", "--json"], ["doctor"], ["doctor", "--json"], ["explain", "strict"], ["plugins"]):
                hwprofile.reset()
                code = main(argv)
                out, err = capsys.readouterr()
                texts += [out, err, f"exit {code}"]
            hwprofile.reset()
            try:
                hwprofile.profile()
                st = _remote.store()
                if st is not None:  # a request: the store's fault is a warning quoting the client's error
                    st.get("cubin", _remote.cubin_key("0" * 64), 1024)
            except HwprofileError as exc:
                texts.append(f"{exc!s} {exc!r}")
        texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    texts += [str(w.message) for w in warned]
    return "\n".join(texts)


@pytest.mark.parametrize("form", list(forms("h:1")))
def test_a_planted_secret_reaches_no_output(
    form: str, store: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url, secrets = forms(f"127.0.0.1:{store.port}")[form]
    monkeypatch.setenv("HWPROFILE_REMOTE", url)
    monkeypatch.setenv("HWPROFILE_REMOTE_TIMEOUT", "0.5")  # the TLS form's handshake with a plain server waits this long
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    text = every_output(capsys, caplog)
    for secret in secrets:
        assert secret not in text, f"{form}: {secret!r} printed:\n{text}"
    assert MASK in text, f"{form}: the URL was never shown at all, so nothing was tested:\n{text}"


def test_a_store_nobody_answers_on_warns_without_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HWPROFILE_REMOTE", f"redis://admin:{SECRET}@127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("HWPROFILE_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    text = every_output(capsys, caplog)
    assert SECRET not in text and "admin:***@127.0.0.1" in text and "failed while" in text


def test_redact_every_form_in_running_text() -> None:
    for url, secrets in forms("cache:6379").values():
        line = f"error: HWPROFILE_REMOTE='{url}' failed ({url}), see {url}."
        assert all(s not in redact(line) for s in secrets), redact(line)
        assert set(secrets) & set(secrets_of_url(url)) or url.startswith("unix")
    # what docs write in place of a password is no secret; a URL without one is left alone
    assert redact("redis://[[USER]:PASSWORD@]HOST") == "redis://[[USER]:PASSWORD@]HOST"
    assert redact("see redis://cache:6379/0?db=1 now") == "see redis://cache:6379/0?db=1 now"


def test_a_remembered_secret_is_hidden_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    remember("Hunter2Hunter2")
    assert redact("AUTH failed for 'Hunter2Hunter2'") == f"AUTH failed for '{MASK}'"
    with pytest.raises(HwprofileError) as e:
        raise HwprofileError("the password Hunter2Hunter2 was refused")
    assert "Hunter2" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://cache:6379/0?socket_timeout=abc", ("socket_timeout='abc'", "HWPROFILE_REMOTE_TIMEOUT")),
        ("redis://cache:6379?db=x", ("db='x'", "a database number")),
        ("redis://cache:6379/0?dbb=1", ("unknown parameter 'dbb'", "did you mean 'db'")),
        ("redis://cache:6379/0?ssl_cert_reqs=required", ("TLS only", "rediss://")),
        ("rediss://cache:6379/0?ssl_cert_reqs=maybe", ("ssl_cert_reqs='maybe'", "none, optional or required")),
        ("redis://cache:6379/0?socket_keepalive=off", ("socket_keepalive='off'", "1/0, true/false, yes/no")),
        ("redis://cache:6379/x", ("database 'x'", "not a number")),
        ("redis://cache:6379/1?db=2", ("given twice",)),
        ("redis://:Se/cret@cache:6379/0", ("percent-encode", "%2F")),
        ("unix://cache:6379/0", ("unix:// URL names the socket's path",)),
    ],
)
def test_a_url_the_client_would_refuse_is_refused_when_read(
    url: str, words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HWPROFILE_REMOTE", url)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(HwprofileError) as e:  # never a bare ValueError from the client
        hwprofile.profile()
    for w in ("HWPROFILE_REMOTE=", *words):
        assert w in str(e.value), str(e.value)
    assert "Se/cret" not in str(e.value)
    assert main(["show"]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and words[0] in err


def test_every_accepted_parameter_is_one_the_client_takes() -> None:
    import redis

    for name, (_what, _parse, tls) in _storeurl.PARAMS.items():
        value = {"db": "1", "protocol": "3", "ssl_cert_reqs": "required"}.get(name, "1")
        url = f"{'rediss' if tls else 'redis'}://cache:6379?{name}={value}"
        assert _storeurl.check(url, "HWPROFILE_REMOTE_TIMEOUT") == url
        client: Any = redis.Redis.from_url(url)  # makes no connection: the client takes every parameter accepted
        client.close()
