"""llamay/vision against llama.cpp's mtmd: image embeddings of the tiny random mmproj files
(tests/fixtures/vision/README.md) for each projector kind, preprocessing included."""

from __future__ import annotations

import dataclasses
import io

import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import fixture, oracle, vision_mmproj

from llamay.errors import ImageError, ProjectorError
from llamay.vision import Projector, decode_image, encode_jit, prepare, read_mmproj
from llamay.vision.preprocess import resize

KINDS = ("gemma3", "idefics3", "mlp")
F16_KINDS = ("gemma3-f16", "mlp-f16")  # F16 matrices, as real mmproj files store them
IMAGES = ("square32", "wide45x29", "tall20x50")


@pytest.fixture(scope="module")
def images():
    return dict(np.load(fixture("vision", "images.npz")))


@pytest.fixture(scope="module", params=KINDS + F16_KINDS)
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def projector(kind):
    return Projector.load(vision_mmproj(kind))


@pytest.fixture(scope="module")
def golden(kind):
    return np.load(fixture("vision", f"{kind}.llamacpp.npz"))


@pytest.mark.parametrize("name", IMAGES)
def test_embeddings_equal_llamacpp(projector, golden, images, name):
    emb = projector.embed(images[name])
    assert [len(c) for c in emb.chunks] == list(golden[f"chunk_tokens_{name}"])
    got = np.concatenate(emb.chunks)
    ref = golden[f"embd_{name}"]
    assert got.shape == ref.shape
    if projector.cfg.half:
        _close_f16(got, ref)
    else:
        _close(got, ref)


@pytest.mark.parametrize("name", IMAGES)
def test_llamacpp_numerics_embeddings_equal_llamacpp(kind, golden, images, name):
    """numerics="llamacpp": the tower orders every f32 operation as ggml's CPU backend does,
    so its f16 GELU lookups see llama.cpp's inputs: every row within 1e-4 for the F32 files
    (measured: 5.5e-5 at most, the LLaVA tower to the bit); for the F16 files most images
    bit for bit (measured: 2 of 6 keep one row where an f16-rounded activation flips)."""
    p = Projector.load(vision_mmproj(kind), numerics="llamacpp")
    got = np.concatenate(p.embed(images[name]).chunks)
    err = np.abs(got - golden[f"embd_{name}"]).max(axis=-1)
    if p.cfg.half:
        assert np.median(err) < 5e-4 and err.max() < 1.5e-3, err
    else:
        assert err.max() < 1e-4, err
        if kind == "mlp":  # CLIP's tower: every operation in ggml's order
            assert (err > 0).sum() <= 1 and err.max() < 1e-6, err


def test_llamacpp_numerics_f16_files_mostly_bit_for_bit(images):
    """The F16 files in numerics="llamacpp": most images' embeddings equal llama.cpp's bit
    for bit (an f16-rounded activation at a rounding boundary moves the rest)."""
    exact = 0
    for kind in F16_KINDS:
        p = Projector.load(vision_mmproj(kind), numerics="llamacpp")
        g = np.load(fixture("vision", f"{kind}.llamacpp.npz"))
        for name in IMAGES:
            got = np.concatenate(p.embed(images[name]).chunks)
            exact += bool(np.array_equal(got, g[f"embd_{name}"]))
    assert exact >= 3, exact  # measured: 3 of 6 wholly, and all rows but one of a fourth


def test_projector_numerics_are_checked():
    with pytest.raises(ProjectorError, match="numerics must be"):
        Projector.load(vision_mmproj("mlp"), numerics="fast")


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    """Every embedding row within 1e-4 but for isolated ones where ggml's f16 GELU table
    lookup lands on the other side of an f16 rounding boundary. The f32 summation order
    decides, and XLA's CPU dots order by the host's vector width: measured at most 2 rows of
    12-20 per image on AVX-512 (up to 2.7e-4), 3 of 16 on AVX2 (up to 5.1e-4)."""
    err = np.abs(got - ref).max(axis=-1)
    assert np.median(err) < 1e-5, err
    assert (err > 1e-4).mean() <= 0.2, err
    assert err.max() < 1e-3, err


def _close_f16(got: np.ndarray, ref: np.ndarray) -> None:
    """F16 weights: ggml rounds every matmul's activations to f16 and so does llamay, so
    most rows agree to ~1e-6; an activation on the other side of an f16 rounding boundary
    (summation order) moves rows by up to ~2e-3, and a flip in the first layer reaches every
    row through attention (measured on AVX2: mlp-f16 wide45x29, all 16 rows 5e-4 to 2e-3).
    That the rounding is there at all is test_f16_files_round_the_activations's to show."""
    err = np.abs(got - ref).max(axis=-1)
    assert err.max() < 2.5e-3, err


def test_f16_files_round_the_activations(images):
    """Across the F16 files' images most embeddings sit on llama.cpp's (median row under
    5e-4; measured on AVX2: 5 of 6, 3 of them under 1e-6); without the activations'
    rounding none does (every row 7e-4 to 3e-3 off)."""
    near = []
    for kind in F16_KINDS:
        p = Projector.load(vision_mmproj(kind))
        g = np.load(fixture("vision", f"{kind}.llamacpp.npz"))
        for name in IMAGES:
            err = np.abs(np.concatenate(p.embed(images[name]).chunks) - g[f"embd_{name}"])
            near.append(bool(np.median(err.max(axis=-1)) < 5e-4))
    assert sum(near) >= 4, near


def test_f16_weights_round_the_activations(images):
    """The same draws stored F32 and F16: llamay's F16 tower is not its F32 one with
    rounded weights only; the activations' rounding moves it towards llama.cpp's."""
    p16 = Projector.load(vision_mmproj("gemma3-f16"))
    g = np.load(fixture("vision", "gemma3-f16.llamacpp.npz"))
    assert "proj" in p16.cfg.half and "blk.attn_q.weight" in p16.cfg.half
    plain = Projector(dataclasses.replace(p16.cfg, half=frozenset()), p16.weights)
    ref = g["embd_tall20x50"]
    err_rounded = np.abs(np.concatenate(p16.embed(images["tall20x50"]).chunks) - ref).max()
    err_plain = np.abs(np.concatenate(plain.embed(images["tall20x50"]).chunks) - ref).max()
    assert err_rounded < 1e-5 < 1e-4 < err_plain, (err_rounded, err_plain)


def test_config_from_metadata(projector, kind):
    cfg = projector.cfg
    assert (cfg.image_size, cfg.patch_size, cfg.n_embd, cfg.n_head, cfg.n_text) == (
        32,
        8,
        32,
        2,
        64,
    )
    assert cfg.projector == kind.removesuffix("-f16")
    assert cfg.act == ("gelu_quick" if kind.startswith("mlp") else "gelu")
    # every file has 2 blocks but LLaVA's 3, of which clip.cpp runs all but the last
    # (the features of the second-to-last)
    assert cfg.n_layer == 2
    assert cfg.tokens_per_image == (16 if kind.startswith("mlp") else 4)
    assert bool(cfg.half) == kind.endswith("-f16")


def test_encoder_is_batched(projector, images):
    """Tiles encoded together equal each encoded alone (one jitted function over the batch)."""
    tiles = np.concatenate([prepare(images[n], projector.cfg).tiles for n in IMAGES])
    both = np.asarray(encode_jit(projector.cfg, projector.weights, jnp.asarray(tiles)))
    alone = [
        np.asarray(encode_jit(projector.cfg, projector.weights, jnp.asarray(tiles[i : i + 1])))[0]
        for i in range(len(tiles))
    ]
    # judged over every tile's rows together: the batch changes XLA's GEMM blocking, so a
    # tile of 4 rows may hold two GELU-lookup flips (measured on AVX2: 1.3e-4)
    _close(both.reshape(-1, both.shape[-1]), np.concatenate(alone))


def test_resize_equals_pillow_on_wide_images(images):
    """mtmd's resampler is Pillow's; for images Pillow resamples horizontally first (it picks
    the order by size, llama.cpp always goes horizontal first) the bytes are Pillow's."""
    Image = oracle("PIL.Image")
    im = images["wide45x29"]
    for algo, method in (
        ("bilinear", Image.BILINEAR),
        ("bicubic", Image.BICUBIC),
        ("lanczos", Image.LANCZOS),
    ):
        for w, h in ((32, 21), (64, 42), (20, 13), (45, 64)):
            ref = np.asarray(Image.fromarray(im).resize((w, h), method, reducing_gap=None))
            np.testing.assert_array_equal(resize(im, w, h, algo), ref, err_msg=f"{algo} {w}x{h}")


def test_decode_png_bytes_and_errors(images):
    Image = oracle("PIL.Image")
    buf = io.BytesIO()
    Image.fromarray(images["wide45x29"]).save(buf, format="PNG")
    np.testing.assert_array_equal(decode_image(buf.getvalue()), images["wide45x29"])
    with pytest.raises(ImageError, match="cannot be decoded"):
        decode_image(b"not an image")
    with pytest.raises(ImageError, match="HxWx3 uint8"):
        decode_image(np.zeros((4, 4, 3), np.float32))


def test_text_model_is_not_a_projector():
    from fixture_data import tiny_model_file

    with pytest.raises(ProjectorError, match="not a multimodal projector"):
        read_mmproj(tiny_model_file("llama"))


def test_unsupported_projector_type(tmp_path):
    gguf = oracle("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen2vl")
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 3, 2, 2), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ProjectorError, match="'qwen2vl' is not supported"):
        read_mmproj(tmp_path / "x.gguf")
