// GGUF block layouts on the CPU: f16/bf16 conversion, each type's block size, and two
// readers per type: `dequant_block` (f32 values, bit-exact with llamay.quant's
// dequantisation: every scale times quant product is exact in f32, the one rounding is
// the final +m / -dmin*m) and, for K-quants, `kquant_parts` (the integer quants and
// per-element scales ggml's integer dots read, as llamay.quant.qtensor.kquant_parts).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace llamay {

// GGMLType codes (llamay/gguf/constants.py).
enum Type : int32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t rd16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline float rdf16(const uint8_t* p) { return f16_to_f32(rd16(p)); }

// Elements and bytes of one block; 0 for a type without a reader here.
inline int block_elems(int32_t t) {
  switch (t) {
    case F32: case F16: case BF16: return 1;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return 32;
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
  }
}

inline int block_bytes(int32_t t) {
  switch (t) {
    case F32: return 4; case F16: case BF16: return 2;
    case Q4_0: return 18; case Q4_1: return 20; case Q5_0: return 22; case Q5_1: return 24;
    case Q8_0: return 34;
    case Q2_K: return 84; case Q3_K: return 110; case Q4_K: return 144; case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
  }
}

// ggml's get_scale_min_k4 over the 12 packed bytes of Q4_K / Q5_K.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: 16 six-bit scales in [-32, 31].
inline void q3k_scales(const uint8_t* s, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    int lo = (s[i % 8] >> (4 * (i / 8))) & 0xF;
    int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 0x3;
    out[i] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

// The 32-element types: signed (or, for the _1 types, unsigned) quants, d and m.
inline void q32_parts(int32_t t, const uint8_t* b, int8_t* q, float* d, float* m) {
  *d = rdf16(b);
  *m = 0.0f;
  switch (t) {
    case Q4_0:
      for (int j = 0; j < 16; ++j) {
        q[j] = (int8_t)((b[2 + j] & 0xF) - 8);
        q[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
      }
      break;
    case Q4_1:
      *m = rdf16(b + 2);
      for (int j = 0; j < 16; ++j) {
        q[j] = (int8_t)(b[4 + j] & 0xF);
        q[j + 16] = (int8_t)(b[4 + j] >> 4);
      }
      break;
    case Q5_0:
    case Q5_1: {
      const int off = t == Q5_1 ? 4 : 2;
      if (t == Q5_1) *m = rdf16(b + 2);
      uint32_t qh;
      std::memcpy(&qh, b + off, 4);
      const uint8_t* qs = b + off + 4;
      const int bias = t == Q5_0 ? 16 : 0;
      for (int j = 0; j < 16; ++j) {
        int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        q[j] = (int8_t)(((qs[j] & 0xF) | h0) - bias);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | h1) - bias);
      }
      break;
    }
    case Q8_0:
      std::memcpy(q, b + 2, 32);
      break;
  }
}

// K-quants as ggml's integer dots read them (qtensor.kquant_parts): quants q[256] (Q6_K
// unsigned 0..63), each element's sub-block scale sc[256], the sub-block mins (16 for
// Q2_K, 8 for Q4_K/Q5_K, none otherwise: returns their count), d and dmin.
inline int kquant_parts(int32_t t, const uint8_t* b, int8_t* q, int16_t* sc, int16_t* mins,
                        float* d, float* dmin) {
  *dmin = 0.0f;
  switch (t) {
    case Q2_K: {
      const uint8_t *scales = b, *qs = b + 16;
      *d = rdf16(b + 80);
      *dmin = rdf16(b + 82);
      for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) q[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
      for (int e = 0; e < 256; ++e) sc[e] = scales[e / 16] & 0xF;
      for (int s = 0; s < 16; ++s) mins[s] = scales[s] >> 4;
      return 16;
    }
    case Q3_K: {
      const uint8_t *hmask = b, *qs = b + 32;
      *d = rdf16(b + 108);
      int8_t s16[16];
      q3k_scales(b + 96, s16);
      for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) {
            int low = (qs[32 * n + l] >> (2 * j)) & 3;
            int high = (hmask[l] >> (4 * n + j)) & 1;
            q[128 * n + 32 * j + l] = (int8_t)(low - ((high ^ 1) << 2));
          }
      for (int e = 0; e < 256; ++e) sc[e] = s16[e / 16];
      return 0;
    }
    case Q4_K:
    case Q5_K: {
      *d = rdf16(b);
      *dmin = rdf16(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (t == Q5_K ? 48 : 16);
      for (int n = 0; n < 4; ++n)
        for (int h = 0; h < 2; ++h)
          for (int l = 0; l < 32; ++l) {
            const int o = 64 * n + 32 * h + l;
            int v = (qs[32 * n + l] >> (4 * h)) & 0xF;
            if (t == Q5_K) v |= ((qh[l] >> (o / 32)) & 1) << 4;
            q[o] = (int8_t)v;
          }
      for (int s = 0; s < 8; ++s) {
        uint8_t a, m;
        scale_min_k4(s, scales, &a, &m);
        for (int e = 0; e < 32; ++e) sc[32 * s + e] = a;
        mins[s] = m;
      }
      return 8;
    }
    case Q6_K: {
      const uint8_t *ql = b, *qh = b + 128;
      const int8_t* scales = (const int8_t*)(b + 192);
      *d = rdf16(b + 208);
      for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) {
            int low = (ql[64 * n + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0xF;
            int high = (qh[32 * n + l] >> (2 * j)) & 3;
            q[128 * n + 32 * j + l] = (int8_t)(low | (high << 4));
          }
      for (int e = 0; e < 256; ++e) sc[e] = scales[e / 16];
      return 0;
    }
  }
  return 0;
}

// One block of type t as f32 values (block_elems(t) of them).
inline void dequant_block(int32_t t, const uint8_t* b, float* out) {
  switch (t) {
    case F32: std::memcpy(out, b, 4); return;
    case F16: *out = rdf16(b); return;
    case BF16: *out = bf16_to_f32(rd16(b)); return;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: {
      int8_t q[32];
      float d, m;
      q32_parts(t, b, q, &d, &m);
      for (int e = 0; e < 32; ++e) out[e] = d * (float)q[e] + m;
      return;
    }
    default: {
      int8_t q[256];
      int16_t sc[256], mins[16];
      float d, dmin;
      const int n_mins = kquant_parts(t, b, q, sc, mins, &d, &dmin);
      const int per = n_mins ? 256 / n_mins : 256;
      const int bias = t == Q6_K ? 32 : 0;
      for (int e = 0; e < 256; ++e) {
        float v = (d * (float)sc[e]) * (float)(q[e] - bias);
        out[e] = n_mins ? v - dmin * (float)mins[e / per] : v;
      }
    }
  }
}

// A whole row of k elements (row bytes `row`) into out[k].
inline void dequant_row(int32_t t, const uint8_t* row, float* out, int64_t k) {
  if (t == F32) { std::memcpy(out, row, 4 * k); return; }
  if (t == F16) { for (int64_t i = 0; i < k; ++i) out[i] = rdf16(row + 2 * i); return; }
  if (t == BF16) { for (int64_t i = 0; i < k; ++i) out[i] = bf16_to_f32(rd16(row + 2 * i)); return; }
  const int be = block_elems(t), bb = block_bytes(t);
  for (int64_t i = 0; i < k / be; ++i) dequant_block(t, row + i * bb, out + i * be);
}

}  // namespace llamay
