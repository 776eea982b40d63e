"""`llamay serve`: the HTTP server (OpenAI, Anthropic, Ollama, llama.cpp-native and context
APIs) over llamay's engine."""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_PORT = 11435


#: llama.cpp's -ctk/-ctv, shared by `serve`, `run` and `bench`.
CacheTypeKOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-type-k",
        "-ctk",
        help="KV cache type for K: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0 "
        "(llama.cpp's flag; default f32). Block types need a head dim that is a "
        "multiple of 32.",
    ),
]
CacheTypeVOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-type-v", "-ctv", help="KV cache type for V (the types of --cache-type-k)."
    ),
]


def _numerics(value: str) -> str:
    from llamay.api import NUMERICS

    if value not in NUMERICS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(NUMERICS)}")
    return value


#: `generate`, `serve`, `bench` and `eval perplexity`'s choice of rounding (`llamay.load`'s).
NumericsOpt = Annotated[
    str,
    typer.Option(
        "--numerics",
        callback=_numerics,
        help="exact: f32 math over the dequantised weights (transformers' numbers); "
        "llamacpp: llama.cpp's CPU rounding (int8 activation blocks, an f16 cache), bit "
        "for bit, to reproduce its outputs.",
    ),
]
FlashAttnOpt = Annotated[
    str,
    typer.Option(
        "--flash-attn",
        "-fa",
        help="on, off, or auto (which is on): with --numerics llamacpp, round as llama.cpp's "
        "flash attention does (llama.cpp's tools default to auto); exact numerics give the "
        "same results either way.",
    ),
]
# the one-shot commands' images (`generate`, `run`)
MmprojOpt = Annotated[
    Path | None,
    typer.Option(
        "--mmproj",
        exists=True,
        dir_okay=False,
        help="A multimodal projector GGUF (llama.cpp's --mmproj): the model reads images.",
    ),
]
ImageOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--image",
        exists=True,
        dir_okay=False,
        help="An image file (repeatable; the model needs a projector: --mmproj, or a "
        "model's projector layer): each goes where a <__media__> is in PROMPT; without "
        "markers the images go first, as in llama-mtmd-cli and Ollama.",
    ),
]


def image_prompt(prompt: str, images: list[Path] | None) -> tuple[str, list[str] | None]:
    """(prompt, image paths) for `Model.generate`: without `<__media__>` markers in the
    prompt, one per image goes first (llama-mtmd-cli's and Ollama's order)."""
    from llamay.vision import MEDIA_MARKER

    if not images:
        return prompt, None
    if MEDIA_MARKER not in prompt:
        prompt = MEDIA_MARKER * len(images) + prompt
    return prompt, [str(p) for p in images]


def lora_arg(spec: str) -> tuple[str, float]:
    """--lora PATH or PATH:SCALE (scale 1 when absent, as llama.cpp's --lora)."""
    path, sep, scale = spec.rpartition(":")
    if sep:
        try:
            return path, float(scale)
        except ValueError:
            pass
    return spec, 1.0


def lora_list(
    lora: list[str] | None, scaled: list[str] | None, without_apply: bool
) -> list[tuple[str, float]]:
    """The adapters of --lora (PATH or PATH:SCALE) and --lora-scaled (PATH:SCALE), each
    repeatable or comma-separated as llama-server takes them, --lora first; every scale
    0 with --lora-init-without-apply (POST /lora-adapters sets them later)."""
    out = [lora_arg(p) for a in lora or () for p in a.split(",") if p]
    for a in scaled or ():
        for p in (p for p in a.split(",") if p):
            path, scale = lora_arg(p)
            if path == p:
                raise typer.BadParameter(f"{p!r} is not PATH:SCALE", param_hint="--lora-scaled")
            out.append((path, scale))
    return [(p, 0.0) for p, _ in out] if without_apply else out


def parse_models(specs: list[str]) -> dict[str, str]:
    """`-m` values → {name: path or store name}: `NAME=PATH`, a path (named by its file
    stem), or a store name (named as itself)."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep:
            target = spec
            p = Path(spec).expanduser()
            name = p.stem if p.suffix == ".gguf" or p.is_file() else spec
        if not name or not target:
            raise typer.BadParameter(f"--model {spec!r}: expected NAME=PATH, a path or a name")
        out[name] = target
    return out


def _resolve_all(models: dict[str, str]) -> dict[str, Path]:
    from llamay.library import resolve

    return {name: resolve(target) for name, target in models.items()}


def _cache_type(name: str | None, flag: str) -> str | None:
    """A --cache-type-k/-v value checked against `llamay.kv.types.KV_TYPES`."""
    from llamay.kv.types import KV_TYPES

    if name is not None and name.lower() not in KV_TYPES:
        raise typer.BadParameter(
            f"{name!r} is not a KV cache type ({', '.join(KV_TYPES)})", param_hint=flag
        )
    return None if name is None else name.lower()


def register(app: typer.Typer) -> None:
    """Add `serve` and `chat` to the `llamay` app."""
    register_serve(app)
    register_chat(app)


def register_serve(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: Annotated[
            list[str] | None,
            typer.Option(
                "--model",
                "-m",
                help="A model to serve: NAME=PATH, a .gguf path or "
                "a store name (repeatable). Store models load on demand too.",
            ),
        ] = None,
        host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
            "127.0.0.1"
        ),
        port: Annotated[
            int, typer.Option(min=0, max=65535, help="Port to listen on.")
        ] = DEFAULT_PORT,
        api_key: Annotated[
            str | None,
            typer.Option(
                "--api-key",
                envvar="LLAMAY_API_KEY",
                help="Require this key (Authorization: Bearer or x-api-key).",
            ),
        ] = None,
        parallel: Annotated[int, typer.Option(min=1, help="Sequences decoded together.")] = 8,
        ctx: Annotated[
            int | None,
            typer.Option("--ctx", "--ctx-size", "-c", min=1, help="Context length per model."),
        ] = None,
        keep_alive: Annotated[
            float, typer.Option(help="Seconds an idle model stays loaded (negative: forever).")
        ] = 300.0,
        max_tokens: Annotated[
            int | None,
            typer.Option("--max-tokens", min=1, help="The most tokens one request may generate."),
        ] = None,
        mesh: Annotated[
            str | None,
            typer.Option(
                "--mesh",
                help="Shard each model over devices: dp=N (batch rows), tp=M (heads / FFN), "
                "e.g. dp=2,tp=2.",
            ),
        ] = None,
        no_store: Annotated[
            bool,
            typer.Option(
                "--no-store", help="Serve only the --model models, not the local store's."
            ),
        ] = False,
        allow_local_files: Annotated[
            bool,
            typer.Option(
                "--allow-local-files",
                help="Let /api/create's FROM name a GGUF file on this machine (else only "
                "store models and uploaded blobs).",
            ),
        ] = False,
        pooling: Annotated[
            str | None,
            typer.Option(
                "--pooling",
                help="How embeddings pool token states: none, mean, cls, last or rank "
                "(llama-server's flag; default: the GGUF's pooling_type, none for decoders: "
                "serve those with mean, cls or last).",
            ),
        ] = None,
        slot_save_path: Annotated[
            Path | None,
            typer.Option(
                "--slot-save-path",
                help="Directory for llama-server's slot files (POST /slots/{id}?action=save|"
                "restore with a filename); without it those actions are refused.",
            ),
        ] = None,
        lora: Annotated[
            list[str] | None,
            typer.Option(
                "--lora",
                help="A GGUF LoRA adapter for the (first) --model, PATH or PATH:SCALE "
                "(repeatable or comma-separated; llama-server's --lora). Requests pick "
                'adapters and scales with their "lora" field; GET/POST /lora-adapters list '
                "them and set the defaults.",
            ),
        ] = None,
        mmproj: Annotated[
            Path | None,
            typer.Option(
                "--mmproj",
                exists=True,
                dir_okay=False,
                help="A multimodal projector GGUF for the (first) --model (llama-server's "
                "--mmproj): OpenAI chat requests may then carry image_url parts (data: URLs).",
            ),
        ] = None,
        lora_scaled: Annotated[
            list[str] | None,
            typer.Option(
                "--lora-scaled",
                help="GGUF LoRA adapters with their scales, PATH:SCALE[,PATH:SCALE...] "
                "(llama-server's form; after the --lora ones).",
            ),
        ] = None,
        lora_init_without_apply: Annotated[
            bool,
            typer.Option(
                "--lora-init-without-apply",
                help="Load the adapters at scale 0 (off until POST /lora-adapters or a "
                'request\'s "lora" field turns them on).',
            ),
        ] = False,
        cache_type_k: CacheTypeKOpt = None,
        cache_type_v: CacheTypeVOpt = None,
        numerics: NumericsOpt = "exact",
        flash_attn: FlashAttnOpt = "off",
        model_draft: Annotated[
            str | None,
            typer.Option(
                "--model-draft",
                "-md",
                help="Speculative decoding for the default model: a draft model (path or "
                "name, with the same tokenizer) or 'ngram' (prompt lookup: no second model). "
                "llama-server's flag.",
            ),
        ] = None,
        draft_max: Annotated[
            int | None,
            typer.Option(
                "--draft-max",
                "--draft",
                "--draft-n",
                help="Most draft tokens per step (default 16; a request's speculative.n_max).",
            ),
        ] = None,
        draft_min: Annotated[
            int | None,
            typer.Option(
                "--draft-min",
                "--draft-n-min",
                help="Fewest draft tokens worth verifying (default 0; speculative.n_min).",
            ),
        ] = None,
        draft_p_min: Annotated[
            float | None,
            typer.Option(
                "--draft-p-min",
                help="A draft model stops drafting after a token below this probability "
                "(default 0.75; speculative.p_min).",
            ),
        ] = None,
        no_warmup: Annotated[
            bool,
            typer.Option(
                "--no-warmup",
                help="Do not load the --model models and compile their programs at start "
                "(/health is ok at once; first requests compile what they need).",
            ),
        ] = False,
    ) -> None:
        """Serve models over HTTP: OpenAI, Anthropic, Ollama and llama.cpp-compatible APIs.
        The --model models load and compile every program they can run in the background
        at start; /health answers 503 "Loading model" until they are ready."""
        from llamay.api import flash_attn_flag
        from llamay.errors import LlamayError
        from llamay.serve import create_app
        from llamay.serve.app import run_server
        from llamay.serve.models import Models

        if pooling not in (None, "none", "mean", "cls", "last", "rank"):  # llama.cpp's
            raise typer.BadParameter(
                f"{pooling!r} is not a pooling (none, mean, cls, last, rank)",
                param_hint="--pooling",
            )
        try:
            configured = _resolve_all(parse_models(model or []))
            models = Models(
                configured,
                n_ctx=ctx,
                parallel=parallel,
                default_keep_alive=keep_alive,
                use_store=not no_store,
                mesh=mesh,
                pooling=pooling,
                lora=lora_list(lora, lora_scaled, lora_init_without_apply),
                cache_type_k=_cache_type(cache_type_k, "--cache-type-k"),
                cache_type_v=_cache_type(cache_type_v, "--cache-type-v"),
                mmproj=mmproj,
                numerics=numerics,
                flash_attn=flash_attn_flag(flash_attn),
            )
        except LlamayError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=1) from None
        if model_draft is not None:
            from llamay.engine.speculative import check_draft_params

            try:
                check_draft_params(draft_max, draft_min, draft_p_min)
            except LlamayError as exc:
                raise typer.BadParameter(str(exc), param_hint="--draft-*") from None
            opts = {"draft_max": draft_max, "draft_min": draft_min, "p_min": draft_p_min}
            models.speculative = {"draft": model_draft, **opts}
        if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
            print(f"warning: serving on {host} without --api-key", file=sys.stderr)
        app_ = create_app(
            models, api_key=api_key, max_tokens_limit=max_tokens, warm_up=not no_warmup
        )
        app_.state.llamay.extra["allow_local_files"] = allow_local_files
        if slot_save_path is not None:
            app_.state.llamay.extra["slot_save_path"] = str(slot_save_path)
        print(
            f"[llamay] serving {', '.join(configured) or 'the store'} on http://{host}:{port}",
            file=sys.stderr,
        )
        run_server(app_, host, port)


# --- llamay chat ------------------------------------------------------------------------

CHAT_HELP = """commands:
  /bye, /exit       leave
  /clear            forget the conversation (the system prompt stays)
  /save NAME        save the conversation (with its KV, so /load resumes fast)
  /load NAME        load a saved conversation
  /system TEXT      set the system prompt
  /image PATH       give the next message an image (a model with --mmproj)
  /help, /?         this text
end a line with \\ to continue on the next one, or wrap lines in \"\"\" ... \"\"\".
Up and Down bring back earlier lines; Ctrl-C stops an answer; Ctrl-D leaves."""


def _chats_dir() -> Path:
    from llamay.store import store_dir

    return store_dir() / "chats"


def _chat_path(name: str) -> Path:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise ValueError("a conversation name is letters, digits, '_', '.', '-'")
    return _chats_dir() / f"{name}.json"


class ChatSession:
    """One terminal conversation over an engine and the model's chat template."""

    def __init__(self, model, engine, sampler, max_tokens: int, system: str | None = None):
        self.model, self.engine, self.sampler = model, engine, sampler
        self.max_tokens = max_tokens
        self.system = system
        self.history: list[dict] = []
        self.restored = None  # a loaded conversation's KV snapshot, for the next answer
        self.images: list[bytes] = []  # the conversation's images, in order
        self.pending: list[bytes] = []  # images for the next message (/image)

    def add_image(self, path: str) -> None:
        """An image for the next message: it goes before the message's text (as mtmd's
        `<__media__>` marker, as Ollama places a message's images)."""
        if getattr(self.model, "projector", None) is None:
            raise ValueError("this model has no vision projector: start the chat with --mmproj")
        self.pending.append(Path(path).expanduser().read_bytes())

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def answer(self, text: str, out, stopped: threading.Event | None = None) -> str:
        """Stream the reply to `text` into `out`. Once `stopped` is set (the chat loop's
        Ctrl-C) the answer stops and its partial reply is kept, wherever that lands: before
        the first token (the template, the prefill, a compile) or while it streams."""
        from llamay.engine.api import Request
        from llamay.errors import LlamayError
        from llamay.tok import IncrementalDecoder
        from llamay.vision import MEDIA_MARKER

        stopped = threading.Event() if stopped is None else stopped

        self.history.append({"role": "user", "content": MEDIA_MARKER * len(self.pending) + text})
        before, self.images, self.pending = self.images, self.images + self.pending, []
        prompt = self.model.tokenizer.apply_chat_template(self.messages())
        spans = ()
        if self.images:  # each image's embeddings where its marker is (llamay.multimodal)
            try:
                ids, spans = self.model._image_prompt(prompt, self.images)
            except LlamayError as exc:  # a bad image: this turn is dropped, the chat goes on
                self.history.pop()
                self.images = before
                raise ValueError(str(exc)) from exc
        else:
            ids = self.model.tokenize(prompt, add_special=True, parse_special=True)
        parts: list[str] = []
        cut = stopped.is_set()  # a Ctrl-C before the request: it is never submitted
        if not cut:
            handle = self._start(Request(ids, self.max_tokens, self.sampler, images=spans))
            dec = IncrementalDecoder(self.model.tokenizer)
            for ev in handle:
                if stopped.is_set():
                    self.engine.cancel(handle)
                    cut = True
                    break
                piece = dec.feed(ev.token_id)
                if piece:
                    parts.append(piece)
                    out.write(piece)
                    out.flush()
            else:
                parts.append(dec.flush())
                out.write(parts[-1])
        if cut:
            out.write(" [stopped]")
        out.write("\n")
        out.flush()
        reply = "".join(parts)
        self.history.append({"role": "assistant", "content": reply})
        return reply

    def _start(self, request):
        """Submit `request`; after a /load, continue from the saved conversation's KV
        (only the new turn is computed) when its tokens begin the prompt."""
        from llamay.errors import SnapshotError

        snap, self.restored = self.restored, None
        ids = request.prompt_ids
        if (
            snap is not None
            and not request.images
            and len(ids) > len(snap.tokens)
            and ids[: len(snap.tokens)] == snap.tokens
        ):
            import dataclasses

            try:
                more = dataclasses.replace(request, prompt_ids=ids[len(snap.tokens) :])
                return self.engine.restore(snap, more)
            except SnapshotError:
                pass  # another model's, or another KV type: compute it all
        return self.engine.submit(request)

    def _snapshot(self, ids: list[int]) -> str | None:
        """The KV of `ids` computed and saved in the store's snapshots (its digest), or None
        where the engine cannot keep KV."""
        import asyncio

        from llamay.kv.snapshot import store_snapshot
        from llamay.serve import kept

        if not ids or not kept.supports_kv(self.engine):
            return None
        kv = asyncio.run(kept.prefill(self.engine, ids))
        try:
            return store_snapshot(self.engine.snapshot(kv.handle))
        finally:
            kv.drop()

    def save(self, name: str) -> Path:
        """The conversation as JSON (messages, tokens) and its KV as a store snapshot."""
        import json

        if self.images:
            raise ValueError("a conversation with images cannot be saved yet")
        path = _chat_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        ids = self.model.tokenize(
            self.model.tokenizer.apply_chat_template(self.messages(), add_generation_prompt=False)
            if self.history
            else "",
            add_special=bool(self.history),
            parse_special=True,
        )
        data = {"system": self.system, "messages": self.history, "tokens": ids}
        data["kv"] = self._snapshot(ids)
        path.write_text(json.dumps(data))
        return path

    def load(self, name: str) -> None:
        import json

        from llamay.errors import SnapshotError
        from llamay.kv.snapshot import load_snapshot

        data = json.loads(_chat_path(name).read_text())
        self.system = data.get("system")
        self.history = list(data.get("messages", []))
        self.restored = None
        if data.get("kv"):
            try:
                self.restored = load_snapshot(data["kv"])
            except SnapshotError:
                pass  # its KV left the store: the next answer computes the conversation


def _read_input(prompt: str) -> str | None:
    """One user turn: a line, lines joined by a trailing backslash, or a \"\"\" block."""
    try:
        line = input(prompt)
    except EOFError:
        return None
    if line.strip().startswith('"""'):
        lines = [line.strip()[3:]]
        while not lines[-1].rstrip().endswith('"""'):
            try:
                lines.append(input("... "))
            except EOFError:
                break
        lines[-1] = lines[-1].rstrip().removesuffix('"""')
        return "\n".join(lines).strip("\n")
    lines = [line]
    while lines[-1].endswith("\\"):
        lines[-1] = lines[-1][:-1]
        try:
            lines.append(input("... "))
        except EOFError:
            break
    return "\n".join(lines)


#: Lines of the chat prompt's history kept between chats (ollama keeps its own likewise).
HISTORY_LINES = 1000


@contextmanager
def _line_editing():
    """Arrow keys, Up/Down through the lines typed in this and earlier chats and Ctrl-R in
    the prompt, as `ollama run` and llama-cli have them: `input()` edits with GNU readline
    (libedit on macOS) once its module is imported. The history is the store's
    `chat_history` (readable by its owner only), written back when the chat ends. Not
    for piped input; Windows has no module."""
    try:
        import readline
    except ImportError:
        readline = None
    if readline is None or not sys.stdin.isatty():
        yield
        return
    from llamay.store import store_dir

    path = store_dir() / "chat_history"
    with suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LINES)
    try:
        yield
    finally:
        with suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            os.chmod(path, 0o600)  # one found wider is narrowed (GNU readline rewrites it
            # 0600 itself; libedit, macOS's, may write in place)
            readline.write_history_file(path)


class _CtrlC:
    """The chat's SIGINT handler, for the whole chat: at the prompt a KeyboardInterrupt
    (the line is dropped, as the terminal drops a typed line that no one has read yet);
    from the moment a line is read, a flag the answer polls. A KeyboardInterrupt raised
    wherever the signal lands after the read (a library's frame, the command dispatch)
    was lost or ended the chat."""

    def __init__(self):
        self.stopped = threading.Event()
        self.reading = True

    def read(self, prompt: str) -> str | None:
        self.stopped.clear()
        self.reading = True
        try:
            return _read_input(prompt)
        finally:
            self.reading = False

    def __call__(self, signum, frame) -> None:
        if self.reading:
            raise KeyboardInterrupt
        self.stopped.set()

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach the main thread only: Ctrl-C is the caller's there
            return
        previous = signal.signal(signal.SIGINT, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def chat_loop(session: ChatSession, out=sys.stdout) -> None:
    print("type /help for commands, /bye to leave", file=sys.stderr, flush=True)
    with _CtrlC().installed() as ctrl_c:
        _chat_turns(session, out, ctrl_c)


def _chat_turns(session: ChatSession, out, ctrl_c: _CtrlC) -> None:
    while True:
        try:
            text = ctrl_c.read(">>> ")
        except KeyboardInterrupt:
            out.write("\n(use /bye or Ctrl-D to leave)\n")
            continue
        cmd, _, arg = (text or "").strip().partition(" ")
        if text is None or cmd in ("/bye", "/exit"):  # Ollama's two
            return
        try:
            if cmd in ("/help", "/?"):
                out.write(CHAT_HELP + "\n")
            elif cmd == "/clear":
                session.history.clear()
                session.images, session.pending = [], []
                out.write("cleared\n")
            elif cmd == "/image":
                session.add_image(arg.strip())
                out.write("image added to the next message\n")
            elif cmd == "/save":
                out.write(f"saved to {session.save(arg.strip())}\n")
            elif cmd == "/load":
                session.load(arg.strip())
                out.write(f"loaded {arg.strip()} ({len(session.history)} messages)\n")
            elif cmd == "/system":
                session.system = arg.strip() or None
                out.write("system prompt set\n")
            elif cmd.startswith("/") and " " not in cmd and len(cmd) > 1:
                out.write(f"unknown command {cmd} (try /help)\n")
            elif text.strip():
                session.answer(text, out, ctrl_c.stopped)
        except (ValueError, OSError) as exc:
            out.write(f"error: {exc}\n")
        out.flush()


def register_chat(app: typer.Typer) -> None:
    @app.command()
    def chat(
        model: Annotated[
            str, typer.Option("--model", "-m", help="A .gguf path or a store name.")
        ] = "smollm2:135m",
        system: Annotated[
            str | None,
            typer.Option("--system", "--system-prompt", "-sys", help="A system prompt."),
        ] = None,
        max_tokens: Annotated[
            int, typer.Option("--max-tokens", "-n", min=1, help="The most tokens of an answer.")
        ] = 512,
        temperature: Annotated[
            float, typer.Option("--temperature", "--temp", min=0.0, help="0: greedy.")
        ] = 0.8,
        seed: Annotated[
            int | None,
            typer.Option("--seed", "-s", help="Seed of the draws (default: a new one)."),
        ] = None,
        ctx: Annotated[
            int | None,
            typer.Option(
                "--ctx", "--ctx-size", "-c", min=1, help="Context length (default: the model's)."
            ),
        ] = None,
        mmproj: Annotated[
            Path | None,
            typer.Option(
                "--mmproj",
                help="A multimodal projector GGUF (llama.cpp's --mmproj): /image PATH then "
                "gives the next message an image.",
            ),
        ] = None,
    ) -> None:
        """Chat with MODEL in the terminal (streaming; /help for commands)."""
        import llamay
        from llamay.errors import LlamayError
        from llamay.sample import Sampler
        from llamay.serve.models import make_engine

        try:
            m = llamay.load(model, n_ctx=ctx)
            if mmproj is not None:
                m.attach_projector(mmproj)
            sampler = Sampler(temperature=temperature, seed=seed)
        except (LlamayError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(code=1) from None
        engine = make_engine(m, parallel=1)
        try:
            with _line_editing():
                chat_loop(ChatSession(m, engine, sampler, max_tokens, system))
        finally:
            engine.close()
