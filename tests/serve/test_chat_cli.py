"""`llamay chat` driven through a pseudo-terminal: a streamed greedy answer equal to
`Model.generate` for the template, llama-cli's option names, history across turns,
multi-line input, /save, /clear, /load, Ctrl-C stopping an answer without leaving, /bye
(and Ollama's /exit, /?), readline editing and its history across chats."""

from __future__ import annotations

import os
import pty
import select
import stat
import sys
import time

import pytest

from tests.serve.conftest import chat_prompt, greedy

pytestmark = pytest.mark.slow


class Term:
    """A command on a fresh pseudo-terminal that is its controlling terminal (so Ctrl-C
    there is a SIGINT), started without forking this multi-threaded process by hand."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        import shutil
        import subprocess

        master, slave = pty.openpty()
        setsid = shutil.which("setsid")
        if setsid is None:
            pytest.skip("setsid (util-linux) is needed to give the chat a controlling tty")
        self.proc = subprocess.Popen(
            [setsid, "-c", *argv], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
        )
        os.close(slave)
        self.pid, self.fd, self.buf = self.proc.pid, master, ""

    def read_until(self, marker: str, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {marker!r}; got {self.buf[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    raise AssertionError(f"the chat ended; output {self.buf[-2000:]!r}") from None
                self.buf += data.decode("utf-8", "replace").replace("\r\n", "\n")
        head, _, self.buf = self.buf.partition(marker)
        return head

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=60)
        finally:
            os.close(self.fd)


@pytest.fixture
def chat(tiny_paths, serve_home):
    """Start `llamay chat` on the tiny llama (greedy) with a token budget."""
    started: list[Term] = []

    def start(max_tokens: int, *more: str) -> Term:
        env = {**os.environ, "LLAMAY_HOME": str(serve_home), "TERM": "dumb"}
        argv = [
            sys.executable,
            "-m",
            "llamay_cli.main",
            "chat",
            "-m",
            str(tiny_paths["tiny"]),
            "--temperature",
            "0",
            "--max-tokens",
            str(max_tokens),
            *more,
        ]
        started.append(Term(argv, env))
        return started[-1]

    yield start
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait(timeout=30)


def replies_greedily(term: Term, tiny, msgs: list[dict]) -> str:
    """The answer up to the next prompt, checked to end with greedy's 8 tokens after `msgs`."""
    reply = term.read_until(">>> ")
    assert reply.rstrip("\n").endswith(greedy(tiny, chat_prompt(tiny, msgs), 8))
    return reply


def bye(term: Term) -> None:
    term.send("/bye\n")
    assert term.close() == 0


def test_chat_session(chat, tiny):
    term = chat(8)
    term.read_until(">>> ")
    term.send("Hello there\n")
    first = term.read_until(">>> ")
    msgs = [{"role": "user", "content": "Hello there"}]
    reply = greedy(tiny, chat_prompt(tiny, msgs), 8)
    assert first.split("\n", 1)[1].rstrip("\n") == reply  # after the echoed input line
    # multi-line input: a trailing backslash continues the turn
    term.send("line one\\\n")
    term.read_until("... ")
    term.send("line two\n")
    msgs += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "line one\nline two"},
    ]
    replies_greedily(term, tiny, msgs)
    term.send("/save conv1\n")
    assert "saved to" in term.read_until(">>> ")
    term.send("/clear\n")
    assert "cleared" in term.read_until(">>> ")
    term.send("/load conv1\n")
    assert "loaded conv1 (4 messages)" in term.read_until(">>> ")
    bye(term)


def test_llama_cli_option_names(chat, tiny):
    """-sys is the system prompt and -s the seed, as llama-cli names them."""
    term = chat(8, "-sys", "Be brief.", "-s", "7")
    term.read_until(">>> ")
    term.send("Hello there\n")
    term.read_until("Hello there\n")  # the echoed input line
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
    ]
    replies_greedily(term, tiny, msgs)
    bye(term)


def test_up_arrow_recalls_the_turn_before(chat, tiny):
    """The prompt edits with readline: Up then Enter sends the previous turn again."""
    term = chat(8)
    term.read_until(">>> ")
    term.send("Hello there\n")
    first = term.read_until(">>> ").split("\n", 1)[1].rstrip("\n")
    term.send("\x1b[A")  # Up: the line comes back into the prompt
    term.read_until("Hello there")
    term.send("\n")
    msgs = [{"role": "user", "content": "Hello there"}]
    assert first == greedy(tiny, chat_prompt(tiny, msgs), 8)
    msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "Hello there"}]
    replies_greedily(term, tiny, msgs)
    bye(term)


def test_the_prompt_history_outlives_the_chat(chat, tiny, serve_home):
    """Lines typed in one chat come back with Up in the next (the store's chat_history,
    its owner's alone, narrowed again when found wider)."""
    term = chat(8)
    term.read_until(">>> ")
    term.send("A line to remember\n")
    term.read_until(">>> ")
    bye(term)
    (history,) = serve_home.rglob("chat_history")
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    history.chmod(0o644)
    term = chat(8)
    term.read_until(">>> ")
    term.send("\x1b[A\x1b[A")  # Up twice: past /bye to the line before it
    term.read_until("A line to remember")
    term.send("\n")
    replies_greedily(term, tiny, [{"role": "user", "content": "A line to remember"}])
    bye(term)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600


def test_ctrl_c_at_the_prompt_drops_the_line(chat, tiny):
    """Ctrl-C on a half-typed line drops it (the chat says how to leave) and the chat goes
    on: the next turn is answered as the conversation's first. (A ^C within the
    millisecond readline spends echoing a key is seen only at Enter: CPython's readline
    checks signals only when its select() is interrupted; hence the pause, a typist's.)"""
    term = chat(8)
    term.read_until(">>> ")
    term.send("half a line")
    term.read_until("half a line")
    time.sleep(0.3)
    term.send("\x03")
    assert "(use /bye or Ctrl-D to leave)" in term.read_until(">>> ")
    term.send("Hello there\n")
    replies_greedily(term, tiny, [{"role": "user", "content": "Hello there"}])
    bye(term)


@pytest.mark.parametrize("delay", [0, 0.3])
def test_ctrl_c_stops_an_answer_not_the_chat(chat, delay):
    """0.3 s after the echo: before the first token on a fresh clone (a KeyboardInterrupt
    there was lost and the whole answer came), while it streams once its programs are on
    disk. At 0 s the ^C may also reach the terminal before the chat has read the line:
    the terminal drops the line then (as it does for any program), and the chat says so;
    either way no whole answer comes and the chat goes on."""
    t = chat(1500)
    t.read_until(">>> ")
    t.send("Tell me everything\n")
    t.read_until("Tell me everything\n")
    time.sleep(delay)
    t.send("\x03")
    out = t.read_until(">>> ", timeout=60)
    if delay:
        assert "[stopped]" in out
    else:
        assert ("[stopped]" in out) != ("(use /bye or Ctrl-D to leave)" in out), out
    bye(t)


def test_saved_conversation_carries_its_kv(tiny_paths, serve_home, tiny):
    """/save writes the conversation's KV to the store's snapshots; after /load (here in
    a fresh engine, nothing cached) the next answer computes only the new turn."""
    import io
    import json

    from llamay.sample import GREEDY
    from llamay.serve.models import make_engine
    from llamay_cli.serve_cmds import ChatSession

    first = make_engine(tiny, 1)
    s1 = ChatSession(tiny, first, GREEDY, 6, system="You answer briefly.")
    s1.answer("Hello there", io.StringIO())
    data = json.loads(s1.save("kvconv").read_text())
    first.close()
    assert (serve_home / "kv" / (data["kv"].removeprefix("sha256:") + ".kv.npz")).is_file()

    fresh = make_engine(tiny, 1)
    try:
        s2 = ChatSession(tiny, fresh, GREEDY, 6)
        s2.load("kvconv")
        reply = s2.answer("And then?", io.StringIO())
        prompt = chat_prompt(tiny, s2.messages()[:-1])
        assert reply == greedy(tiny, prompt, 6)
        ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
        saved = data["tokens"]
        assert ids[: len(saved)] == saved and len(saved) > 20
        new = len(ids) - len(saved)
        # the new turn, then at most the 6 answer tokens fed back: the saved part was not
        assert new <= fresh.stats()["computed_tokens"] <= new + 6
    finally:
        fresh.close()


def test_ollamas_command_names_work_too(chat):
    """`ollama run` leaves on /exit as on /bye, and /? is its /help."""
    term = chat(8)
    term.read_until(">>> ")
    term.send("/?\n")
    assert "/save NAME" in term.read_until(">>> ")
    term.send("/exit\n")
    assert term.close() == 0
