"""lm-evaluation-harness adapter: the model class `llamay` (needs the `eval` extra).

llamay declares it as the `lm_eval.models` entry point `llamay`. lm-eval 0.4.13 has no
plugin discovery, so its own command finds it once `llamay eval lm-eval-plugin` has put
a startup hook into site-packages (`llamay.eval.lm_eval_hook`); the arguments are lm-eval's:

    lm_eval --model llamay \\
        --model_args model=smollm2:135m,batch_size=8,numerics=exact --tasks hellaswag

Without the hook, run the same arguments through `llamay eval lm-eval ...` or
`python -m llamay.eval.lm_eval_adapter ...`; from Python, `import
llamay.eval.lm_eval_adapter` before `lm_eval.simple_evaluate(model="llamay", ...)`, or
pass `LlamayLM(...)` as the model.

model_args: `model` (a .gguf path or store name), `numerics` (exact | llamacpp),
`flash_attn` (on | off | auto: llama.cpp's -fa, for llamacpp numerics),
`batch_size` (rows per scoring step, and generations decoding together), `max_length`
(tokens per scored row; default the model's context),
`n_ctx`, `dp` / `tp` (a device mesh, see `llamay.model.sharding`), `distributed`
(multi-host: `jax.distributed.initialize()` first). Another key is an error (a misspelt
`model` would otherwise evaluate the default model); `batch_size=auto` scores 8 at a time,
with a warning.
"""

from __future__ import annotations

import inspect
import warnings

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from llamay.eval.scoring import loglikelihood_rolling, score

DEFAULT_GEN_TOKENS = 256


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


@register_model("llamay")
class LlamayLM(LM):
    def __init__(
        self,
        model: str = "smollm2:135m",
        numerics: str = "exact",
        flash_attn: bool | str = False,
        batch_size: int | str = 8,
        max_length: int | None = None,
        n_ctx: int | None = None,
        dp: int = 1,
        tp: int = 1,
        distributed: bool = False,
        llamay_model=None,
        device: str | None = None,  # lm-eval's flags: llamay places by its mesh instead
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        import llamay
        from llamay.model.sharding import initialize_distributed, sharded_model

        if _bool(distributed):
            initialize_distributed()
        m = llamay_model or llamay.load(
            model, numerics=numerics, n_ctx=int(n_ctx) if n_ctx else None, progress=False,
            flash_attn=flash_attn,
        )  # fmt: skip
        dp, tp = int(dp), int(tp)
        self.model = sharded_model(m, {"data": dp, "model": tp} if dp * tp > 1 else None)
        bs = str(batch_size).split(":")[0]
        if not bs.isdigit():  # lm-eval's "auto" probes the largest batch that fits: not here
            warnings.warn(f"batch_size {batch_size!r}: llamay scores 8 at a time", stacklevel=2)
        self.batch_size = int(bs) if bs.isdigit() else 8
        self.max_length = int(max_length) if max_length else None

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's flags (--batch_size, --device) fill in what model_args leaves out."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(arg_dict) - known)
        if unknown:  # a misspelt key would otherwise evaluate the default model
            names = ", ".join(sorted(known))
            raise ValueError(f"llamay model_args: unknown {', '.join(unknown)}; known: {names}")
        return cls(**{**{k: v for k, v in extra.items() if k in known}, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def tokenizer_name(self) -> str:
        return f"llamay:{self.model.path.name}"

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        args = [r.args for r in requests]
        return score(
            self.model,
            [a[0] for a in args],
            [a[1] for a in args],
            batch=self.batch_size,
            max_length=self.max_length,
        )

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return loglikelihood_rolling(
            self.model,
            [r.args[0] for r in requests],
            batch=self.batch_size,
            max_length=self.max_length,
        )

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation up to its `until` strings, `batch_size` of them
        decoding together in the model's engine (continuous batching: a finished one's
        slot takes the next at once)."""
        from concurrent.futures import ThreadPoolExecutor

        m = self.model.use_parallel(self.batch_size)
        with ThreadPoolExecutor(max_workers=m.parallel) as pool:
            return list(pool.map(lambda r: self._generate(*r.args[:2]), requests))

    def _generate(self, context: str, gen_kwargs: dict | None) -> str:
        kw = dict(gen_kwargs or {})
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_tokens = int(kw.pop("max_gen_toks", DEFAULT_GEN_TOKENS))
        temperature = float(kw.pop("temperature", 0.0))
        if not _bool(kw.pop("do_sample", temperature > 0)):
            temperature = 0.0
        sampling = {k: kw[k] for k in ("top_k", "top_p", "min_p", "seed") if k in kw}
        m = self.model
        ids = m.tokenize(context, add_special=True, parse_special=True)
        n_ctx = m.n_ctx
        if self.max_length:
            n_ctx = min(n_ctx, self.max_length)
        ids = ids[-max(1, n_ctx - max_tokens - 1) :]
        return m.generate(ids, max_tokens, temperature=temperature, stop=until, **sampling)


def main() -> None:
    """lm-eval's command line with the `llamay` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
