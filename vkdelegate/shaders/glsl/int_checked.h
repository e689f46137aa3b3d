// int64 tensors are held in int32 on the device (runtime/dtypes.py). An op whose int64
// result may leave the int32 range computes it with these helpers: a result past the
// range sets the node's word in the graph's error-flag buffer (NodeBuilder.error_flag;
// the run then raises VkDelegateError naming the node) where it would otherwise wrap
// silently (ATen's int64 is exact there). The op declares error_flags as an output
// binding and passes its word's index; defined with CHECK_INT32 only, so the int32 ops
// (which wrap in ATen too) and the float ops pay nothing.
// An integer division, remainder or fmod (int64, and the integer dtypes the device
// holds as they are, which ATen checks too) also flags a zero divisor: bit 2 of the
// word (ZERO_DIVISION_BIT in runtime/dtypes.py), which the run raises as ATen's
// ZeroDivisionError would, where the shader's value would be 0.

layout(set = 0, binding = BINDING_error_flags) buffer error_flag_buffer {
  uint error_flags[];
};

bool int32_overflow = false;  // this invocation's results so far: one left the range
bool int_zero_division = false;  // ... or one divided by zero

int add_checked(int a, int b) {
  const int r = a + b;  // wraps (two's complement); overflow iff both signs differ from r's
  if (((a ^ r) & (b ^ r)) < 0) {
    int32_overflow = true;
  }
  return r;
}

int mul_checked(int a, int b) {
  int hi, lo;
  imulExtended(a, b, hi, lo);
  if (hi != (lo >> 31)) {  // the 64-bit product is not lo sign-extended
    int32_overflow = true;
  }
  return lo;
}

// -a and abs(a): only -2^31 has no int32 negation.
int neg_checked(int a) {
  if (a == -2147483647 - 1) {
    int32_overflow = true;
  }
  return -a;
}

int abs_checked(int a) {
  return a < 0 ? neg_checked(a) : a;
}

// An integer divisor b, flagging 0 (division, remainder and fmod raise in ATen).
int zero_guard(int b) {
  if (b == 0) {
    int_zero_division = true;
  }
  return b;
}

// int64 division's divisor b, flagging 0 and -2^31 / -1 (the one quotient past the
// range).
int div_guard(int a, int b) {
  if (a == -2147483647 - 1 && b == -1) {
    int32_overflow = true;
  }
  return zero_guard(b);
}

// float -> int64 (truncation toward zero, as ATen): a finite value must truncate into
// the int32 range, i.e. lie in [-2^31, 2^31) (both ends exact in fp32; no fp32 value
// lies strictly between -2^31 - 1 and -2^31). NaN and infinities are not flagged: ATen's
// cast leaves them undefined too, and models compute such values on purpose and select
// them away (T5's relative position buckets cast log(0) = -inf to long, then take
// torch.where(is_small, ...)).
int to_int_checked(float v) {
  if (!isinf(v) && !isnan(v) && !(v >= -2147483648.0 && v < 2147483648.0)) {
    int32_overflow = true;
  }
  return int(v);
}

// At the end of main: this invocation's overflow (bit 1) and zero divisor (bit 2), if
// any, into word `slot`.
void report_overflow(int slot) {
  const uint bits = (int32_overflow ? 1u : 0u) | (int_zero_division ? 2u : 0u);
  if (bits != 0u) {
    atomicOr(error_flags[slot], bits);
  }
}
