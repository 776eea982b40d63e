"""Every exception llamay raises on bad input, in one place.

Each names what was wrong (file, field, feature) and, where it helps, what to do.
The HTTP edge maps `LlamayError` subclasses to 4xx responses with the same message.
"""

from __future__ import annotations


class LlamayError(Exception):
    """Base class of llamay's own errors."""


# --- GGUF parsing -------------------------------------------------------------


class GGUFError(LlamayError):
    """A GGUF file could not be read."""


class GGUFTruncatedError(GGUFError):
    """The file ends before a field that the header says is there."""


class GGUFMagicError(GGUFError):
    """The file does not start with the GGUF magic."""


class GGUFVersionError(GGUFError):
    """The GGUF version is not one llamay reads (2 or 3)."""


class GGUFValueTypeError(GGUFError):
    """A metadata value has a type code that GGUF does not define."""


class GGUFBoundsError(GGUFError):
    """A count, length or offset points beyond the end of the file."""


class GGUFTensorError(GGUFError):
    """A tensor description is inconsistent (bad shape, type, alignment, overlap)."""


class GGUFDuplicateError(GGUFError):
    """A metadata key or tensor name appears more than once."""


class GGUFWriteError(GGUFError):
    """Values or tensors given to the GGUF writer cannot be encoded as asked."""


# --- Quantisation ---------------------------------------------------------------


class UnsupportedTensorTypeError(LlamayError):
    """A tensor's GGML type has no dequantiser in llamay."""


class NativeKernelError(LlamayError):
    """The native CPU kernels (llamay.kernels_cpu) cannot be built or loaded."""


# --- Models ---------------------------------------------------------------------


class UnknownArchitectureError(LlamayError):
    """The GGUF's `general.architecture` is not one llamay implements."""


class ModelFormatError(LlamayError):
    """A model file lacks a tensor or metadata key its architecture needs."""


class AdapterError(ModelFormatError):
    """A LoRA adapter file that is not one, or does not fit the model it is loaded on."""


class ProjectorError(ModelFormatError):
    """A multimodal projector (mmproj) file llamay cannot use: not one, an unsupported
    `clip.projector_type`, a missing tensor or key, or a width that does not fit the model."""


class DraftModelError(ModelFormatError):
    """A draft model for speculative decoding that cannot draft for its target (another
    tokenizer, layers the drafter does not support)."""


class ModelNotFoundError(LlamayError):
    """A model name is neither a file nor a name the store knows or can fetch."""


class InvalidModelNameError(LlamayError):
    """A model name that could escape the store directory or is otherwise malformed."""


class FetchError(LlamayError):
    """Fetching a model from its source failed (download, extraction or checksum)."""


# --- Tokenizers -----------------------------------------------------------------


class TokenizerError(LlamayError):
    """The GGUF's tokenizer metadata is missing or of a kind llamay does not build."""


class UnsupportedTokenizerError(TokenizerError):
    """The tokenizer model or pre-tokenizer type is one llamay does not implement."""


class ChatTemplateError(TokenizerError):
    """A chat template failed to render: bad syntax, `raise_exception`, or an unsafe operation."""


# --- Requests -------------------------------------------------------------------


class RequestError(LlamayError):
    """A generation request is invalid (bad sampling parameters, prompt too long, ...)."""


class ContextOverflowError(RequestError):
    """The prompt plus requested tokens do not fit the model's context: `n_prompt_tokens`
    (at least that many) and `n_ctx` when known, as llama-server's error reports them."""

    def __init__(self, message: str, n_prompt_tokens: int | None = None, n_ctx: int | None = None):
        super().__init__(message)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class KVCacheFullError(RequestError):
    """The KV page pool cannot hold a request (now, or ever: then make the pool larger)."""


class ImageError(RequestError):
    """An image input that cannot be used: undecodable bytes, an http(s) URL (there is no
    network fetch), a model without a projector, or more images than markers."""


class SnapshotError(RequestError):
    """A KV snapshot is unreadable or belongs to another model, KV dtype or page layout."""


# --- OCR ------------------------------------------------------------------------


class OCRError(LlamayError):
    """An OCR input, lexicon, language model or recognizer file is unusable."""


# --- constraints ----------------------------------------------------------------


class ConstraintError(RequestError):
    """A constraint (JSON schema, grammar, regex, choices) cannot be built or was broken."""


class GrammarSyntaxError(ConstraintError):
    """A grammar, regex or schema does not parse; the message says where."""


class GrammarLimitError(ConstraintError):
    """A grammar, regex or schema exceeds a size limit (text length, repetition count,
    nesting, rule count: `llamay.constrain.limits`); the message names the limit."""


class UnsupportedConstraintError(ConstraintError):
    """A schema keyword or grammar feature that cannot be enforced; the message names it
    (pass lenient=True to drop it, and the result says what was dropped)."""


class ConstraintIncompleteError(ConstraintError):
    """Generation ended (token budget, context) before the constraint was satisfied;
    `partial` holds the text generated so far."""

    partial: str = ""
