"""Every credential and endpoint source, alone and in pairs, in a fresh
interpreter with an isolated HOME and a clean environment (no AWS_*/S3_*
variables but those under test, never the EC2 metadata service).

A pair's loser always carries a wrong secret (or a dead endpoint), so a
read that succeeds proves the winner was used; and the swapped pair must
fail with an AuthError that names the winner."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import as_bytes, random_tensor
from servers import SeaweedFS, free_port

import fastshard

pytestmark = pytest.mark.s3

_PROBE = r"""
import hashlib, json, sys
from fastshard import _native
uri, opts = sys.argv[1], json.loads(sys.argv[2])
try:
    r = _native.Reader(uri, **opts)
    entries = r.entries()
    bufs = [bytearray(e[7]) for e in entries]
    stats = r.load(list(range(len(entries))), bufs)
    digest = hashlib.sha256(b"".join(bufs)).hexdigest()
    print(json.dumps({"ok": True, "sha256": digest, "names": [e[0] for e in entries],
                      "requests": stats["requests"]}))
except Exception as e:
    print(json.dumps({"ok": False, "type": type(e).__name__, "message": str(e),
                      "args": [repr(a) for a in e.args],
                      "mro": [c.__name__ for c in type(e).__mro__]}))
"""

# The only variables of ours an isolated run inherits (none can hold credentials).
_KEEP = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT", "TMPDIR")


def isolated_env(home: Path, **variables: str) -> dict[str, str]:
    """A clean environment: HOME is ``home``, no AWS_*/S3_* variables but
    ``variables``, and never the EC2 metadata service."""
    env = {k: os.environ[k] for k in _KEEP if k in os.environ}
    env.update(HOME=str(home), AWS_EC2_METADATA_DISABLED="true", PYTHONDONTWRITEBYTECODE="1")
    env.update(variables)
    return env


def probe(
    uri: str, home: Path, opts: dict[str, Any] | None = None, **variables: str
) -> dict[str, Any]:
    """Open and load ``uri`` with the native reader in a fresh interpreter
    under :func:`isolated_env`; returns what it saw (digest or error)."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, uri, json.dumps(opts or {})],
        env=isolated_env(home, **variables),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


BAD_SECRET = "wrong-secret-Kx93Tq"
PROFILE = "fastshard-profile"


@pytest.fixture(scope="module")
def objects(seaweed: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small object in the private bucket, a copy in the public one,
    and the digest of its tensor bytes."""
    sd = {"w": random_tensor(torch.bfloat16, (64, 32), 1), "b": torch.arange(7)}
    path = tmp_path_factory.mktemp("creds") / "a.tensors"
    fastshard.save(sd, path)
    return {
        "private": seaweed.upload(path, "creds/a.tensors"),
        "public": seaweed.upload(path, "creds/a.tensors", bucket=seaweed.public_bucket),
        "sha256": hashlib.sha256(
            b"".join(as_bytes(t).numpy().tobytes() for t in sd.values())
        ).hexdigest(),
    }


class Home:
    """An isolated HOME with helpers that write the config files."""

    def __init__(self, root: Path, server: SeaweedFS) -> None:
        self.root = root
        self.server = server

    def s3cfg(self, secret: str, name: str = ".s3cfg", host: str | None = None) -> Path:
        path = self.root / name
        host = host or f"127.0.0.1:{self.server.s3_port}"
        path.write_text(
            "[default]\n"
            f"access_key = {self.server.access_key}\n"
            f"secret_key = {secret}\n"
            f"host_base = {host}\n"
            f"host_bucket = {host}\n"
            "use_https = False\n"
        )
        return path

    def aws_profile(self, secret: str, profile: str = PROFILE, endpoint: bool = True) -> None:
        aws = self.root / ".aws"
        aws.mkdir(exist_ok=True)
        (aws / "credentials").write_text(
            f"[{profile}]\naws_access_key_id = {self.server.access_key}\n"
            f"aws_secret_access_key = {secret}\n"
        )
        section = "default" if profile == "default" else f"profile {profile}"
        lines = [f"[{section}]", "region = us-east-1"]
        if endpoint:
            lines.append(f"endpoint_url = {self.server.endpoint}")
        (aws / "config").write_text("\n".join(lines) + "\n")


def vllm_env(server: SeaweedFS, secret: str, endpoint: bool = True) -> dict[str, str]:
    env = {"S3_ACCESS_KEY_ID": server.access_key, "S3_SECRET_ACCESS_KEY": secret}
    if endpoint:
        env["S3_ENDPOINT_URL"] = server.endpoint
    return env


def aws_env(server: SeaweedFS, secret: str, endpoint: bool = True) -> dict[str, str]:
    env = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": secret}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = server.endpoint
    return env


def explicit(server: SeaweedFS, secret: str) -> dict[str, Any]:
    return {**server.opts(), "s3_secret_access_key": secret}


def check_ok(result: dict[str, Any], objects: dict[str, Any]) -> None:
    assert result.get("ok"), result
    assert result["sha256"] == objects["sha256"]
    assert result["names"] == ["w", "b"]


def check_auth(result: dict[str, Any], source: str) -> None:
    assert not result.get("ok"), result
    assert result["type"] == "AuthError", result
    assert source in result["message"], result
    text = result["message"] + "".join(result["args"])
    assert BAD_SECRET not in text and "fastshard-test-secret" not in text


Case = tuple[str, Path, tuple[str, dict[str, Any]], dict[str, str]]


def run_all(cases: list[Case]) -> dict[str, Any]:
    """Probe (name, home, (uri, opts), env) cases in parallel subprocesses."""
    with ThreadPoolExecutor(4) as pool:
        futures = {
            name: pool.submit(probe, uri, root, {"max_attempts": 2, **opts}, **env)
            for name, root, (uri, opts), env in cases
        }
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture
def home(tmp_path: Path, seaweed: SeaweedFS) -> Any:
    counter = iter(range(1000))

    def make() -> Home:
        root = tmp_path / f"home{next(counter)}"
        root.mkdir()
        return Home(root, seaweed)

    return make


def test_each_source_alone(seaweed, objects, home):
    uri = objects["private"]
    h = {k: home() for k in ("explicit", "vllm", "s3cfg", "cfgpath", "aws", "aws_s3", "prof", "p2")}
    h["s3cfg"].s3cfg(seaweed.secret_key)
    cfg = h["cfgpath"].s3cfg(seaweed.secret_key, name="elsewhere.cfg")
    h["prof"].aws_profile(seaweed.secret_key)
    h["p2"].aws_profile(seaweed.secret_key)
    aws_s3 = aws_env(seaweed, seaweed.secret_key, endpoint=False)
    aws_s3["AWS_ENDPOINT_URL_S3"] = seaweed.endpoint
    results = run_all(
        [
            ("explicit", h["explicit"].root, (uri, seaweed.opts()), {}),
            ("vllm", h["vllm"].root, (uri, {}), vllm_env(seaweed, seaweed.secret_key)),
            ("s3cfg", h["s3cfg"].root, (uri, {}), {}),
            ("s3_config_path", h["cfgpath"].root, (uri, {"s3_config_path": str(cfg)}), {}),
            ("aws_env", h["aws"].root, (uri, {}), aws_env(seaweed, seaweed.secret_key)),
            ("aws_endpoint_url_s3", h["aws_s3"].root, (uri, {}), aws_s3),
            # Credentials and endpoint_url both from the named profile.
            ("aws_profile", h["prof"].root, (uri, {}), {"AWS_PROFILE": PROFILE}),
            ("s3_profile_option", h["p2"].root, (uri, {"s3_profile": PROFILE}), {}),
        ]
    )
    for name, result in results.items():
        assert result.get("ok"), (name, result)
        check_ok(result, objects)


def test_precedence_pairs(seaweed, objects, home):
    uri = objects["private"]
    good, bad = seaweed.secret_key, BAD_SECRET
    cases = []
    # explicit > S3_* (vLLM)
    cases.append(
        ("explicit>vllm", home().root, (uri, explicit(seaweed, good)), vllm_env(seaweed, bad))
    )
    cases.append(
        ("explicit<vllm", home().root, (uri, explicit(seaweed, bad)), vllm_env(seaweed, good))
    )
    # S3_* > ~/.s3cfg
    h1, h2 = home(), home()
    h1.s3cfg(bad)
    h2.s3cfg(good)
    cases.append(("vllm>s3cfg", h1.root, (uri, {}), vllm_env(seaweed, good)))
    cases.append(("vllm<s3cfg", h2.root, (uri, {}), vllm_env(seaweed, bad)))
    # ~/.s3cfg > AWS_* variables
    h3, h4 = home(), home()
    h3.s3cfg(good)
    h4.s3cfg(bad)
    cases.append(("s3cfg>aws", h3.root, (uri, {}), aws_env(seaweed, bad)))
    cases.append(("s3cfg<aws", h4.root, (uri, {}), aws_env(seaweed, good)))
    # Inside the AWS chain: variables > profile files.
    h5, h6 = home(), home()
    h5.aws_profile(bad, profile="default")
    h6.aws_profile(good, profile="default")
    cases.append(("awsenv>profile", h5.root, (uri, {}), aws_env(seaweed, good)))
    cases.append(("awsenv<profile", h6.root, (uri, {}), aws_env(seaweed, bad)))
    results = run_all(cases)
    check_ok(results["explicit>vllm"], objects)
    check_auth(results["explicit<vllm"], "explicit")
    check_ok(results["vllm>s3cfg"], objects)
    check_auth(results["vllm<s3cfg"], "S3_ACCESS_KEY_ID")
    check_ok(results["s3cfg>aws"], objects)
    check_auth(results["s3cfg<aws"], ".s3cfg")
    check_ok(results["awsenv>profile"], objects)
    check_auth(results["awsenv<profile"], "AWS credential chain")


def test_endpoint_precedence(seaweed, objects, home):
    uri = objects["private"]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at once
    profile = home()
    profile.aws_profile(seaweed.secret_key)
    (profile.root / ".aws" / "config").write_text(
        f"[profile {PROFILE}]\nregion = us-east-1\nendpoint_url = {dead}\n"
    )
    keys = vllm_env(seaweed, seaweed.secret_key, endpoint=False)
    unused, used = home(), home()
    unused.s3cfg(seaweed.secret_key, host=dead.removeprefix("http://"))
    used.s3cfg(seaweed.secret_key)
    results = run_all(
        [
            (
                "explicit>S3_ENDPOINT_URL",
                home().root,
                (uri, seaweed.opts()),
                {"S3_ENDPOINT_URL": dead},
            ),
            (
                "S3_ENDPOINT_URL>AWS_ENDPOINT_URL_S3",
                home().root,
                (uri, {}),
                {**keys, "S3_ENDPOINT_URL": seaweed.endpoint, "AWS_ENDPOINT_URL_S3": dead},
            ),
            (
                "AWS_ENDPOINT_URL_S3>AWS_ENDPOINT_URL",
                home().root,
                (uri, {}),
                {**keys, "AWS_ENDPOINT_URL_S3": seaweed.endpoint, "AWS_ENDPOINT_URL": dead},
            ),
            # .s3cfg's host_base counts only when its keys are used...
            (
                "s3cfg host_base unused",
                unused.root,
                (uri, {}),
                {**keys, "AWS_ENDPOINT_URL": seaweed.endpoint},
            ),
            # ...and then beats the AWS variables.
            ("s3cfg host_base>AWS_ENDPOINT_URL", used.root, (uri, {}), {"AWS_ENDPOINT_URL": dead}),
            # The profile's endpoint_url loses to AWS_ENDPOINT_URL.
            (
                "AWS_ENDPOINT_URL>profile",
                profile.root,
                (uri, {}),
                {"AWS_PROFILE": PROFILE, "AWS_ENDPOINT_URL": seaweed.endpoint},
            ),
        ]
    )
    for name, result in results.items():
        assert result.get("ok"), (name, result)
        check_ok(result, objects)


def test_anonymous_access(seaweed, objects, home):
    h = home()
    h.s3cfg(BAD_SECRET)  # ignored when anonymous is asked for
    endpoint = {"AWS_ENDPOINT_URL": seaweed.endpoint}
    results = run_all(
        [
            # No credentials anywhere: unsigned requests.
            ("public", home().root, (objects["public"], {}), endpoint),
            ("private", home().root, (objects["private"], {}), endpoint),
            # Asked for, whatever credentials exist.
            (
                "option public",
                h.root,
                (objects["public"], {"s3_anonymous": True}),
                vllm_env(seaweed, BAD_SECRET),
            ),
            (
                "option private",
                h.root,
                (objects["private"], {"s3_anonymous": True}),
                aws_env(seaweed, seaweed.secret_key),
            ),
            # tensorizer's convention: two empty keys.
            (
                "empty keys",
                h.root,
                (
                    objects["public"],
                    {
                        "s3_access_key_id": "",
                        "s3_secret_access_key": "",
                        "s3_endpoint": seaweed.endpoint,
                    },
                ),
                {},
            ),
        ]
    )
    for name in ("public", "option public", "empty keys"):
        check_ok(results[name], objects)
    for name in ("private", "option private"):
        check_auth(results[name], "anonymous access")


def test_a_broken_or_missing_credential_source_is_an_auth_error(seaweed, objects, home):
    # A profile whose credential_process exits with an error is set up but
    # broken: the load says so instead of reading the bucket unsigned.
    h = home()
    aws = h.root / ".aws"
    aws.mkdir(exist_ok=True)
    (aws / "config").write_text(
        f"[profile {PROFILE}]\nregion = us-east-1\nendpoint_url = {seaweed.endpoint}\n"
        "credential_process = false\n"
    )
    uri = objects["public"]
    endpoint = {"AWS_ENDPOINT_URL": seaweed.endpoint}
    results = run_all(
        [
            ("broken", h.root, (uri, {}), {"AWS_PROFILE": PROFILE}),
            # A profile asked for by name that no file defines (boto3: ProfileNotFound).
            ("missing", home().root, (uri, {}), {**endpoint, "AWS_PROFILE": "no-such"}),
            ("missing option", home().root, (uri, {"s3_profile": "no-such"}), endpoint),
            # The same object read unsigned when nothing is set up at all.
            ("none", home().root, (uri, {}), endpoint),
            ("default", home().root, (uri, {}), {**endpoint, "AWS_PROFILE": "default"}),
        ]
    )
    check_auth(results["broken"], "could not get credentials from the AWS credential chain")
    for name in ("missing", "missing option"):
        check_auth(results[name], 'AWS profile "no-such" is not defined')
    check_ok(results["none"], objects)
    check_ok(results["default"], objects)
