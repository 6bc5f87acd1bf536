#include "reduce.h"

#include <cstdint>
#include <cstring>

#include "c4d/nccl_abi.h"

namespace sim {
namespace {

struct Sum {
  template <class T> static T f(T a, T b) { return T(a + b); }
};
struct Prod {
  template <class T> static T f(T a, T b) { return T(a * b); }
};
struct Max {
  template <class T> static T f(T a, T b) { return a < b ? b : a; }
};
struct Min {
  template <class T> static T f(T a, T b) { return b < a ? b : a; }
};

template <class T, class Op>
void fold(T* out, const void* const* ins, int n, size_t count) {
  memcpy(out, ins[0], count * sizeof(T));
  for (int r = 1; r < n; ++r) {
    const T* in = static_cast<const T*>(ins[r]);
    for (size_t i = 0; i < count; ++i) out[i] = Op::f(out[i], in[i]);
  }
}

template <class T>
void reduce_native(T* out, const void* const* ins, int n, size_t count, int op) {
  switch (op) {
    case ncclSum: fold<T, Sum>(out, ins, n, count); break;
    case ncclProd: fold<T, Prod>(out, ins, n, count); break;
    case ncclMax: fold<T, Max>(out, ins, n, count); break;
    case ncclMin: fold<T, Min>(out, ins, n, count); break;
    case ncclAvg:
      fold<T, Sum>(out, ins, n, count);
      for (size_t i = 0; i < count; ++i) out[i] = T(out[i] / T(n));
      break;
  }
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u); /* overflow → inf */
  if (absx < 0x38800000u) {                                  /* subnormal or zero half */
    if (absx < 0x33000000u) return uint16_t(sign);
    uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t s = 126 - e; /* half subnormal mantissa = m * 2^(e - 126), s in [14, 24] */
    uint32_t r = m >> s, rem = m & ((1u << s) - 1), halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return uint16_t(sign | r);
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

/* 16-bit floats: widen a block of every input to float, reduce, narrow once. */
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_16(uint16_t* out, const void* const* ins, int n, size_t count, int op) {
  constexpr size_t kBlock = 512;
  float acc[kBlock], tmp[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t m = count - base < kBlock ? count - base : kBlock;
    const uint16_t* in0 = static_cast<const uint16_t*>(ins[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = Widen(in0[i]);
    for (int r = 1; r < n; ++r) {
      const uint16_t* in = static_cast<const uint16_t*>(ins[r]) + base;
      for (size_t i = 0; i < m; ++i) tmp[i] = Widen(in[i]);
      for (size_t i = 0; i < m; ++i) {
        switch (op) {
          case ncclSum: case ncclAvg: acc[i] += tmp[i]; break;
          case ncclProd: acc[i] *= tmp[i]; break;
          case ncclMax: acc[i] = acc[i] < tmp[i] ? tmp[i] : acc[i]; break;
          case ncclMin: acc[i] = tmp[i] < acc[i] ? tmp[i] : acc[i]; break;
        }
      }
    }
    if (op == ncclAvg)
      for (size_t i = 0; i < m; ++i) acc[i] /= float(n);
    for (size_t i = 0; i < m; ++i) out[base + i] = Narrow(acc[i]);
  }
}

}  // namespace

bool reducible(int dtype, int redop) {
  if (redop < ncclSum || redop > ncclAvg) return false;
  switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclInt32: case ncclUint32: case ncclInt64: case ncclUint64:
    case ncclFloat16: case ncclFloat32: case ncclFloat64: case ncclBfloat16:
      return true;
    default:
      return false;
  }
}

void reduce_n(void* out, const void* const* ins, int n, size_t count, int dtype, int redop) {
  switch (dtype) {
    case ncclInt8: reduce_native(static_cast<int8_t*>(out), ins, n, count, redop); break;
    case ncclUint8: reduce_native(static_cast<uint8_t*>(out), ins, n, count, redop); break;
    case ncclInt32: reduce_native(static_cast<int32_t*>(out), ins, n, count, redop); break;
    case ncclUint32: reduce_native(static_cast<uint32_t*>(out), ins, n, count, redop); break;
    case ncclInt64: reduce_native(static_cast<int64_t*>(out), ins, n, count, redop); break;
    case ncclUint64: reduce_native(static_cast<uint64_t*>(out), ins, n, count, redop); break;
    case ncclFloat32: reduce_native(static_cast<float*>(out), ins, n, count, redop); break;
    case ncclFloat64: reduce_native(static_cast<double*>(out), ins, n, count, redop); break;
    case ncclFloat16:
      reduce_16<half_to_float, float_to_half>(static_cast<uint16_t*>(out), ins, n, count, redop);
      break;
    case ncclBfloat16:
      reduce_16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(out), ins, n, count, redop);
      break;
  }
}

}  // namespace sim
