"""packaging/install.sh and install.ps1: parse checks (and that they catch breakage),
the decisions install.sh makes (dry runs with faked system tools), and a real install
into a temporary prefix from the local checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from pkgtestlib import (
    CHECK_SCRIPTS,
    INSTALL_PS1,
    INSTALL_SH,
    REPO,
    base_python,
    built_dist,
    clean_env,
)

# Bashisms that break `curl ... | sh` on Debian, where /bin/sh is dash: each is a syntax
# error for dash's parser.
DASH_SYNTAX_BASHISMS = [
    "opts=(--quiet --yes)",
    'diff <(echo "$PREFIX") <(echo "$BIN_DIR")',
    'cat <<< "$PREFIX"',
    "function cleanup { rm -f x; }",
]
# Bashisms dash parses but fails on at run time: shellcheck catches them.
SHELLCHECK_BASHISMS = ['[[ -n "$PREFIX" ]] && echo set', 'echo "${PREFIX:0:1}"']


def sh(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def with_injected(tmp_path: Path, line: str) -> Path:
    """A copy of install.sh with `line` inserted after `set -eu`."""
    text = INSTALL_SH.read_text()
    assert "\nset -eu\n" in text
    copy = tmp_path / "install.sh"
    copy.write_text(text.replace("\nset -eu\n", f"\nset -eu\n{line}\n", 1))
    return copy


def test_install_sh_parses_under_sh_and_dash():
    assert sh("sh", "-n", str(INSTALL_SH)).returncode == 0
    if shutil.which("dash") is None:
        pytest.skip("dash is not installed")
    r = sh("dash", "-n", str(INSTALL_SH))
    assert r.returncode == 0, r.stderr


def test_check_scripts_passes_on_ours():
    r = sh("sh", str(CHECK_SCRIPTS))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("bashism", DASH_SYNTAX_BASHISMS)
def test_bashism_makes_dash_n_fail(tmp_path, bashism):
    if shutil.which("dash") is None:
        pytest.skip("dash is not installed")
    broken = with_injected(tmp_path, bashism)
    r = sh("dash", "-n", str(broken))
    assert r.returncode != 0, f"dash -n accepted {bashism!r}"
    r = sh("sh", str(CHECK_SCRIPTS), str(broken))
    assert r.returncode != 0 and f"FAIL  dash -n {broken}" in r.stderr


@pytest.mark.parametrize("bashism", SHELLCHECK_BASHISMS)
def test_bashism_makes_shellcheck_fail(tmp_path, bashism):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    assert sh("shellcheck", "-s", "sh", str(INSTALL_SH)).returncode == 0
    broken = with_injected(tmp_path, bashism)
    r = sh("sh", str(CHECK_SCRIPTS), str(broken))
    assert r.returncode != 0 and f"FAIL  shellcheck {broken}" in r.stderr


def test_install_ps1_parses_under_powershell():
    if shutil.which("pwsh") is None:
        pytest.skip("pwsh (PowerShell) is not installed; install.ps1 is parse-checked where it is")
    r = sh("sh", str(CHECK_SCRIPTS), str(INSTALL_PS1))
    assert r.returncode == 0, r.stdout + r.stderr


def ps1_bracket_errors(text: str) -> list[str]:
    """Unbalanced (), {}, [] in PowerShell source, outside comments and strings: a coarse
    stand-in for the parser where pwsh is missing (no here-strings or block comments)."""
    pairs, stack, errors = {")": "(", "}": "{", "]": "["}, [], []
    i, line = 0, 1
    while i < len(text):
        c = text[i]
        if c == "\n":
            line += 1
        elif c == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif c in "'\"":
            j = i + 1
            while j < len(text):
                if c == '"' and text[j] == "`":
                    j += 2
                    continue
                if text[j] == c:
                    if j + 1 < len(text) and text[j + 1] == c:  # '' or "" inside the string
                        j += 2
                        continue
                    break
                line += text[j] == "\n"
                j += 1
            else:
                errors.append(f"line {line}: unterminated string")
            i = j
        elif c in "({[":
            stack.append((c, line))
        elif c in ")}]":
            if not stack or stack[-1][0] != pairs[c]:
                errors.append(f"line {line}: unexpected {c!r}")
            else:
                stack.pop()
        i += 1
    errors += [f"line {ln}: {c!r} never closed" for c, ln in stack]
    return errors


def test_install_ps1_brackets_balance():
    assert ps1_bracket_errors(INSTALL_PS1.read_text()) == []
    assert ps1_bracket_errors("if ($x) { Say 'a' ") == ["line 1: '{' never closed"]
    assert ps1_bracket_errors('Say "it\'s (fine"; $a = @(1, 2)') == []
    assert ps1_bracket_errors("$a = @(1, 2))") == ["line 1: unexpected ')'"]


def test_install_ps1_has_no_bom_and_names_no_index_host():
    for f in (INSTALL_SH, INSTALL_PS1):
        raw = f.read_bytes()
        assert not raw.startswith(b"\xef\xbb\xbf"), f"{f.name} starts with a BOM"
        text = raw.decode()
        assert "index-url" not in text and "://" not in text, f"{f.name} names a host"


# -- decisions, as dry runs with faked system tools ------------------------------------------


def fake_tools(tmp_path: Path, **tools: str) -> Path:
    """A bin dir of tiny sh scripts named after `tools`, each printing its value."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    for name, out in tools.items():
        p = d / name
        p.write_text(f"#!/bin/sh\necho '{out}'\n")
        p.chmod(0o755)
    return d


def dry_run(tmp_path: Path, *args: str, path_prefix: Path | None = None, shell: str = "sh"):
    env = clean_env(HOME=str(tmp_path / "home"))
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return sh(
        shell,
        str(INSTALL_SH),
        "--dry-run",
        "--python",
        base_python(),
        "--prefix",
        str(tmp_path / "prefix"),
        *args,
        env=env,
    )


def test_dry_run_plans_a_cpu_install_from_the_checkout(tmp_path):
    r = dry_run(tmp_path, "--extra", "cpu", shell="dash" if shutil.which("dash") else "sh")
    assert r.returncode == 0, r.stderr
    assert "backend: cpu\n" in r.stdout
    assert f"installing: {REPO} into {tmp_path / 'prefix'}" in r.stdout
    assert f"would run: {base_python()} -m venv {tmp_path / 'prefix'}" in r.stdout
    assert "dry run: nothing was changed" in r.stdout
    assert not (tmp_path / "prefix").exists()


def test_nvidia_driver_selects_the_cuda_extra(tmp_path):
    fake = fake_tools(tmp_path, **{"nvidia-smi": "GPU 0: fake"})
    r = dry_run(tmp_path, path_prefix=fake)
    assert r.returncode == 0, r.stderr
    assert "backend: cuda (nvidia-smi found)" in r.stdout
    assert f"pip install {REPO}[cuda]" in r.stdout


def test_explicit_extra_and_source(tmp_path):
    r = dry_run(tmp_path, "--extra", "tpu", "--source", "llamay")
    assert r.returncode == 0, r.stderr
    assert "pip install llamay[tpu]" in r.stdout
    r = dry_run(tmp_path, "--extra=gpu")
    assert r.returncode != 0 and "--extra must be auto, cpu, cuda, cuda13, tpu or metal" in r.stderr
    r = dry_run(tmp_path, "--extra", "cuda13", "--source", "llamay")
    assert r.returncode == 0 and "pip install llamay[cuda13]" in r.stdout, r.stderr


def test_metal_extra_only_on_apple_silicon(tmp_path):
    r = dry_run(tmp_path, "--extra", "metal")
    assert r.returncode == 1 and "only for macOS on Apple silicon" in r.stderr
    d = tmp_path / "fakebin"
    d.mkdir()
    (d / "uname").write_text("#!/bin/sh\ncase $1 in -s) echo Darwin ;; -m) echo arm64 ;; esac\n")
    (d / "uname").chmod(0o755)
    r = dry_run(tmp_path, "--extra", "metal", "--source", "llamay", path_prefix=d)
    assert r.returncode == 0 and "pip install llamay[metal]" in r.stdout, r.stderr
    r = dry_run(tmp_path, "--source", "llamay", path_prefix=d)  # auto keeps the CPU build
    assert r.returncode == 0 and "backend: cpu" in r.stdout, r.stderr


@pytest.mark.parametrize(
    ("system", "machine", "message"),
    [
        ("SunOS", "i86pc", "unsupported system 'SunOS'"),
        ("Linux", "riscv64", "no build for Linux on riscv64"),
        ("Darwin", "x86_64", "only on Apple silicon"),
        ("MINGW64_NT-10.0", "x86_64", "use packaging/install.ps1"),
    ],
)
def test_refuses_unsupported_systems(tmp_path, system, machine, message):
    d = tmp_path / "fakebin"
    d.mkdir()
    (d / "uname").write_text(
        f"#!/bin/sh\ncase $1 in -s) echo {system} ;; -m) echo {machine} ;; esac\n"
    )
    (d / "uname").chmod(0o755)
    r = dry_run(tmp_path, path_prefix=d)
    assert r.returncode == 1 and message in r.stderr, r.stderr


def test_refuses_a_prefix_that_is_not_an_environment(tmp_path):
    (tmp_path / "prefix").mkdir()
    (tmp_path / "prefix" / "precious.txt").write_text("keep me")
    r = dry_run(tmp_path)
    assert r.returncode == 1 and "is not a Python environment" in r.stderr
    assert (tmp_path / "prefix" / "precious.txt").read_text() == "keep me"


def test_refuses_an_old_python(tmp_path):
    fake = fake_tools(tmp_path)
    old = fake / "python-old"
    old.write_text("#!/bin/sh\nexit 1\n")
    old.chmod(0o755)
    r = sh("sh", str(INSTALL_SH), "--dry-run", "--python", str(old), env=clean_env())
    assert r.returncode == 1 and "is not a Python >= 3.12" in r.stderr


# -- for real --------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_install_into_a_temp_prefix(tmp_path):
    """install.sh installs the checkout's wheel into a fresh prefix and links `llamay`.

    Offline: the prefix's environment is created first from this venv's base Python, with a
    .pth file that lends it this venv's installed dependencies (install.sh reuses an
    existing environment), and pip installs only llamay itself (`--no-deps`)."""
    wheel, _ = built_dist()
    prefix, bindir = tmp_path / "prefix", tmp_path / "bin"
    r = sh(base_python(), "-m", "venv", str(prefix))
    assert r.returncode == 0, r.stderr
    r = sh(
        str(prefix / "bin" / "python"),
        "-c",
        "import sysconfig; print(sysconfig.get_path('purelib'))",
    )
    (Path(r.stdout.strip()) / "_llamay_test_deps.pth").write_text(
        sysconfig.get_path("purelib") + "\n"
    )
    env = clean_env(HOME=str(tmp_path / "home"), LLAMAY_PIP_ARGS="--no-deps --force-reinstall")
    r = sh(
        "sh",
        str(INSTALL_SH),
        "--prefix",
        str(prefix),
        "--bin-dir",
        str(bindir),
        "--python",
        base_python(),
        "--source",
        str(wheel),
        "--extra",
        "cpu",
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr + (prefix / "install.log").read_text()
    assert "reusing the environment" in r.stdout
    assert f"installed llamay {_version()} (cpu) into {prefix}" in r.stdout
    assert f"{bindir} is not on your PATH" in r.stdout
    llamay = bindir / "llamay"
    assert llamay.is_symlink() and llamay.resolve() == (prefix / "bin" / "llamay").resolve()
    # the installed copy is the one that runs, not this checkout
    r = sh(
        str(prefix / "bin" / "python"), "-c", "import llamay; print(llamay.__file__)", cwd=tmp_path
    )
    assert r.stdout.strip().startswith(str(prefix)), r.stdout
    # and it works: describe a model generated here
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from verify_generated_model import make_model
    finally:
        sys.path.remove(str(REPO / "scripts"))
    model = tmp_path / "tiny.gguf"
    make_model(model, seed=1)
    r = sh(str(llamay), "show", "--json", str(model), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["architecture"] == "llama" and info["block_count"] == 2


def test_pip_without_pip_fails_clearly(tmp_path):
    """An environment in the prefix whose pip is missing: install.sh says pip failed and
    shows its log, and exits non-zero."""
    prefix = tmp_path / "prefix"
    assert sh(base_python(), "-m", "venv", "--without-pip", str(prefix)).returncode == 0
    r = sh(
        "sh",
        str(INSTALL_SH),
        "--prefix",
        str(prefix),
        "--bin-dir",
        str(tmp_path / "bin"),
        "--python",
        base_python(),
        "--extra",
        "cpu",
        env=clean_env(HOME=str(tmp_path)),
    )
    assert r.returncode == 1
    assert "pip could not install" in r.stderr and "No module named pip" in r.stderr
    assert not (tmp_path / "bin" / "llamay").exists()


def _version() -> str:
    import llamay

    return llamay.__version__


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_piped_into_sh_installs_the_released_package(tmp_path):
    """`curl ... | sh -s -- ARGS`: no checkout around, so pip installs `llamay` by name."""
    shell = "dash" if shutil.which("dash") else "sh"
    r = subprocess.run(
        [
            shell,
            "-s",
            "--",
            "--dry-run",
            "--extra",
            "cpu",
            "--python",
            base_python(),
            "--prefix",
            str(tmp_path / "prefix"),
        ],
        input=INSTALL_SH.read_text(),
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(HOME=str(tmp_path)),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert f"would run: {tmp_path / 'prefix'}/bin/python -m pip install llamay\n" in r.stdout


def test_pip_args_are_words_not_file_names(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a.whl").write_text("")
    env = clean_env(HOME=str(tmp_path), LLAMAY_PIP_ARGS=f"--no-index --find-links {tmp_path}/*")
    r = sh(
        "sh",
        str(INSTALL_SH),
        "--dry-run",
        "--extra",
        "cpu",
        "--source",
        "llamay",
        "--python",
        base_python(),
        "--prefix",
        str(tmp_path / "prefix"),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert f"pip install --no-index --find-links {tmp_path}/* llamay\n" in r.stdout
