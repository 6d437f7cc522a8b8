// The model layer's own CUDA kernels, compiled at run time by NVRTC (no compiler binary on the
// node). f32 everywhere; sizes are int. Layouts as documented in ops.rs.

#define GELU_K 0.7978845608f
#define EPS 1e-5f
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
// Sum over a block of 256 threads; every thread gets the result.
__device__ float block_sum(float v, float* sh) {
    v = warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < (blockDim.x >> 5) ? sh[lane] : 0.f;
    return warp_sum(t);
}
#define IDX (blockIdx.x * blockDim.x + threadIdx.x)
#define ROW_WARP int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); int lane = threadIdx.x & 31;

// f32 -> bf16 (as its 16 bits), rounding to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ unsigned int bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Four elements per thread (16-byte loads, 8-byte stores: buffers start 256-byte aligned), the
// last n % 4 one by one.
extern "C" __global__ void to_bf16(const float* x, unsigned short* y, long n) {
    long n4 = n / 4, stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4*>(x)[i];
        uint2 o;
        o.x = bf16_bits(v.x) | (bf16_bits(v.y) << 16);
        o.y = bf16_bits(v.z) | (bf16_bits(v.w) << 16);
        reinterpret_cast<uint2*>(y)[i] = o;
    }
    for (long i = n4 * 4 + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = (unsigned short)bf16_bits(x[i]);
}
extern "C" __global__ void fill(float* x, float v, int n) { int i = IDX; if (i < n) x[i] = v; }
extern "C" __global__ void set1(float* x, int i, float v) { if (IDX == 0) x[i] = v; }
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) { int i = IDX; if (i < n) y[i] += a * x[i]; }
// out = a + b, or ReLU(a + b) when relu (NaN passes through, as in relu_fwd).
extern "C" __global__ void add2(const float* a, const float* b, float* out, int n, int relu) {
    int i = IDX; if (i >= n) return;
    float s = a[i] + b[i];
    out[i] = relu && s < 0.f ? 0.f : s;
}
// Grid (column blocks of 256, row blocks of BIAS_ROWS): each thread keeps its bias in a
// register and walks its column down the block's rows (no division per element). The walk is
// unrolled over the BIAS_ROWS of a whole block, loads first, so a thread's loads are all in flight
// at once (the pointers are __restrict__: the backend's buffers never alias, a
// kernel's outputs are distinct allocations from its inputs).
#define BIAS_ROWS 16
#define BIAS_WALK(LOAD, ...)                                               \
    int j = blockIdx.x * blockDim.x + threadIdx.x;                         \
    if (j >= cols) return;                                                 \
    float bj = b[j];                                                       \
    long i0 = (long)blockIdx.y * BIAS_ROWS * cols + j;                     \
    int left = rows - blockIdx.y * BIAS_ROWS;                              \
    if (left >= BIAS_ROWS) {                                               \
        float ins[BIAS_ROWS];                                              \
        _Pragma("unroll") for (int k = 0; k < BIAS_ROWS; k++) {            \
            long i = i0 + (long)k * cols;                                  \
            ins[k] = LOAD;                                                 \
        }                                                                  \
        _Pragma("unroll") for (int k = 0; k < BIAS_ROWS; k++) {            \
            long i = i0 + (long)k * cols;                                  \
            float in = ins[k];                                             \
            __VA_ARGS__                                                    \
        }                                                                  \
    } else {                                                               \
        for (int k = 0; k < left; k++) {                                   \
            long i = i0 + (long)k * cols;                                  \
            float in = LOAD;                                               \
            __VA_ARGS__                                                    \
        }                                                                  \
    }
// y and its bf16 twin y_h (the attention's and the products' operand).
extern "C" __global__ void add_bias(float* __restrict__ y, unsigned short* __restrict__ y_h, const float* __restrict__ b, int rows, int cols) {
    BIAS_WALK(y[i], float v = in + bj; y[i] = v; y_h[i] = (unsigned short)bf16_bits(v);)
}
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + tanhf(GELU_K * (v + 0.044715f * v * v * v))); }
// y += bias, out = GELU(y) and its bf16 twin out_h, on add_bias's grid.
extern "C" __global__ void add_bias_gelu(float* __restrict__ y, const float* __restrict__ b, float* __restrict__ out, unsigned short* __restrict__ out_h, int rows, int cols) {
    BIAS_WALK(y[i], float v = in + bj, o = gelu(v); y[i] = v; out[i] = o; out_h[i] = (unsigned short)bf16_bits(o);)
}
// out = x + z + bias (a projection's bias and the residual), on add_bias's grid.
extern "C" __global__ void add_bias_residual(const float* __restrict__ z, const float* __restrict__ b, const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
    BIAS_WALK(x[i] + z[i], out[i] = in + bj;)
}
// Column sums in two passes, summed in the same order every time (no atomics). Grid (column
// blocks of 32, chunks), block (32, 8): part[chunk * cols + j] sums rows
// [chunk * per, (chunk + 1) * per) of column j.
extern "C" __global__ void col_part(const float* __restrict__ x, float* __restrict__ part, int rows, int cols, int per) {
    __shared__ float sh[8][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    float s = 0.f;
    if (j < cols) for (int r = r0 + threadIdx.y; r < r1; r += 8) s += x[(long)r * cols + j];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        float t = 0.f;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        part[(long)blockIdx.y * cols + j] = t;
    }
}
// out[j] = the parts of column j summed in chunk order.
extern "C" __global__ void col_finish(const float* part, float* out, int chunks, int cols) {
    int j = IDX; if (j >= cols) return;
    float t = 0.f;
    for (int k = 0; k < chunks; k++) t += part[(long)k * cols + j];
    out[j] = t;
}
extern "C" __global__ void embed_fwd(const float* tok, const float* wte, const float* wpe, float* out, int n, int t, int c) {
    int i = IDX; if (i >= n * c) return;
    int r = i / c, j = i % c;
    out[i] = wte[(long)(int)tok[r] * c + j] + wpe[(r % t) * c + j];
}
// The token embedding's gradient, one thread per (token, feature): the token's rows (rows,
// grouped by token in row order; token v's at starts[v]..starts[v + 1]) added in that order,
// the CPU backend's order, with no atomic adds: the same sums every run.
extern "C" __global__ void embed_bwd_wte(const float* __restrict__ rows, const float* __restrict__ starts, const float* __restrict__ dout, float* __restrict__ dwte, int n, int vocab, int c) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)vocab * c) return;
    int v = (int)(i / c), j = (int)(i % c);
    int s = (int)starts[v], e = (int)starts[v + 1];
    if (e == s) return;
    float acc = dwte[i];
    for (int k = max(s, 0); k < min(e, n); k++) {
        int r = (int)rows[k];
        if (r >= 0 && r < n) acc += dout[(long)r * c + j];
    }
    dwte[i] = acc;
}
// The position embedding's gradient, one thread per (position, feature): the sequences' rows at
// that position in order.
extern "C" __global__ void embed_bwd_wpe(const float* __restrict__ dout, float* __restrict__ dwpe, int n, int t, int c) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)t * c) return;
    int p = (int)(i / c), j = (int)(i % c);
    float acc = dwpe[i];
    for (int r = p; r < n; r += t) acc += dout[(long)r * c + j];
    dwpe[i] = acc;
}
// Whether a buffer can be read or written four floats (or four bf16) at a time from element 0.
__device__ __forceinline__ bool al16(const void* p) { return ((unsigned long long)p & 15) == 0; }
__device__ __forceinline__ bool al8(const void* p) { return ((unsigned long long)p & 7) == 0; }
// Layer norm rows of c features with c % 4 == 0 and c <= 128 LN_VEC (768 and 2048 in the
// models), in buffers that start 16-byte aligned (then so does every row), take the fast path:
// a warp reads its row once, as float4s kept in registers, and writes float4s and four bf16 at
// a time. Other rows go element by element, re-reading the row.
#define LN_VEC 16
__device__ __forceinline__ bool ln_fast(int c, const void* a, const void* b, const void* h) {
    return (c & 3) == 0 && c <= 128 * LN_VEC && al16(a) && al16(b) && al8(h);
}
__device__ __forceinline__ void store4(float* __restrict__ out, unsigned short* __restrict__ out_h, long i4, float4 v) {
    reinterpret_cast<float4*>(out)[i4] = v;
    uint2 h;
    h.x = bf16_bits(v.x) | (bf16_bits(v.y) << 16);
    h.y = bf16_bits(v.z) | (bf16_bits(v.w) << 16);
    reinterpret_cast<uint2*>(out_h)[i4] = h;
}
__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
// One warp per row; out and its bf16 twin out_h.
extern "C" __global__ void ln_fwd(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b, float* __restrict__ out, unsigned short* __restrict__ out_h, float* __restrict__ mean, float* __restrict__ rstd, int rows, int c) {
    ROW_WARP
    if (row >= rows) return;
    const float* xr = x + (long)row * c;
    float mu, rs;
    if (ln_fast(c, x, out, out_h) && al16(g) && al16(b)) {
        int n4 = c >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4 v[LN_VEC];
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < LN_VEC; k++) {
            int j = lane + 32 * k;
            if (j < n4) { v[k] = x4[j]; s += sum4(v[k]); }
        }
        mu = warp_sum(s) / c;
        float q = 0.f;
#pragma unroll
        for (int k = 0; k < LN_VEC; k++) {
            if (lane + 32 * k < n4) {
                float4 d = make_float4(v[k].x - mu, v[k].y - mu, v[k].z - mu, v[k].w - mu);
                q += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
            }
        }
        rs = rsqrtf(warp_sum(q) / c + EPS);
        const float4 *g4 = reinterpret_cast<const float4*>(g), *b4 = reinterpret_cast<const float4*>(b);
        long o4 = (long)row * n4;
#pragma unroll
        for (int k = 0; k < LN_VEC; k++) {
            int j = lane + 32 * k;
            if (j < n4) {
                float4 gg = g4[j], bb = b4[j], o;
                o.x = (v[k].x - mu) * rs * gg.x + bb.x;
                o.y = (v[k].y - mu) * rs * gg.y + bb.y;
                o.z = (v[k].z - mu) * rs * gg.z + bb.z;
                o.w = (v[k].w - mu) * rs * gg.w + bb.w;
                store4(out, out_h, o4 + j, o);
            }
        }
    } else {
        float s = 0.f;
#pragma unroll 4
        for (int j = lane; j < c; j += 32) s += xr[j];
        mu = warp_sum(s) / c;
        float v = 0.f;
#pragma unroll 4
        for (int j = lane; j < c; j += 32) { float d = xr[j] - mu; v += d * d; }
        rs = rsqrtf(warp_sum(v) / c + EPS);
#pragma unroll 4
        for (int j = lane; j < c; j += 32) {
            float o = (xr[j] - mu) * rs * g[j] + b[j];
            out[(long)row * c + j] = o; out_h[(long)row * c + j] = (unsigned short)bf16_bits(o);
        }
    }
    if (lane == 0) { mean[row] = mu; rstd[row] = rs; }
}
// dx (accumulated) and its bf16 twin dx_h.
extern "C" __global__ void ln_bwd_dx(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ dout, float* __restrict__ dx, unsigned short* __restrict__ dx_h, int rows, int c) {
    ROW_WARP
    if (row >= rows) return;
    long o = (long)row * c;
    float mu = mean[row], rs = rstd[row], s1 = 0.f, s2 = 0.f;
    if (ln_fast(c, x, dout, dx_h) && al16(dx) && al16(g)) {
        int n4 = c >> 2;
        const float4 *x4 = reinterpret_cast<const float4*>(x + o), *d4 = reinterpret_cast<const float4*>(dout + o);
        const float4* g4 = reinterpret_cast<const float4*>(g);
        float4 xh[LN_VEC], dg[LN_VEC];  // x normalised, dout times g
#pragma unroll
        for (int k = 0; k < LN_VEC; k++) {
            int j = lane + 32 * k;
            if (j < n4) {
                float4 xv = x4[j], dv = d4[j], gv = g4[j];
                xh[k] = make_float4((xv.x - mu) * rs, (xv.y - mu) * rs, (xv.z - mu) * rs, (xv.w - mu) * rs);
                dg[k] = make_float4(dv.x * gv.x, dv.y * gv.y, dv.z * gv.z, dv.w * gv.w);
                s1 += sum4(dg[k]);
                s2 += (dg[k].x * xh[k].x + dg[k].y * xh[k].y) + (dg[k].z * xh[k].z + dg[k].w * xh[k].w);
            }
        }
        s1 = warp_sum(s1) / c; s2 = warp_sum(s2) / c;
        float4* dx4 = reinterpret_cast<float4*>(dx + o);
#pragma unroll
        for (int k = 0; k < LN_VEC; k++) {
            int j = lane + 32 * k;
            if (j < n4) {
                float4 a = dx4[j], v;
                v.x = a.x + rs * (dg[k].x - s1 - xh[k].x * s2);
                v.y = a.y + rs * (dg[k].y - s1 - xh[k].y * s2);
                v.z = a.z + rs * (dg[k].z - s1 - xh[k].z * s2);
                v.w = a.w + rs * (dg[k].w - s1 - xh[k].w * s2);
                store4(dx, dx_h, o / 4 + j, v);
            }
        }
        return;
    }
#pragma unroll 4
    for (int j = lane; j < c; j += 32) {
        float xh = (x[o + j] - mu) * rs, d = dout[o + j] * g[j];
        s1 += d; s2 += d * xh;
    }
    s1 = warp_sum(s1) / c; s2 = warp_sum(s2) / c;
#pragma unroll 4
    for (int j = lane; j < c; j += 32) {
        float xh = (x[o + j] - mu) * rs;
        float v = dx[o + j] + rs * (dout[o + j] * g[j] - s1 - xh * s2);
        dx[o + j] = v; dx_h[o + j] = (unsigned short)bf16_bits(v);
    }
}
// dg = sum dout * xhat and db = sum dout by chunks of rows, as col_part: the parts of dg at
// part[chunk * c + j], those of db after them at part[(chunks + chunk) * c + j]; col_finish
// sums each half.
extern "C" __global__ void ln_dgdb_part(const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ dout, float* __restrict__ part, int rows, int c, int per) {
    __shared__ float sg[8][33], sb[8][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    float a = 0.f, b = 0.f;
    if (j < c)
#pragma unroll 4
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
        long i = (long)r * c + j;
        a += dout[i] * (x[i] - mean[r]) * rstd[r];
        b += dout[i];
    }
    sg[threadIdx.y][threadIdx.x] = a; sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && j < c) {
        float ta = 0.f, tb = 0.f;
        for (int k = 0; k < 8; k++) { ta += sg[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
        part[(long)blockIdx.y * c + j] = ta;
        part[(long)(gridDim.y + blockIdx.y) * c + j] = tb;
    }
}
extern "C" __global__ void gelu_fwd(const float* __restrict__ x, float* __restrict__ out, int n) {
    int i = IDX; if (i >= n) return;
    out[i] = gelu(x[i]);
}
__device__ __forceinline__ float gelu_grad(float v, float d) {
    float th = tanhf(GELU_K * (v + 0.044715f * v * v * v));
    return d * (0.5f * (1.f + th) + 0.5f * v * (1.f - th * th) * GELU_K * (1.f + 3.f * 0.044715f * v * v));
}
// dx and its bf16 twin dx_h; one thread per four elements (a grid-stride loop), as float4s when
// every buffer allows, the rest one by one.
extern "C" __global__ void gelu_bwd(const float* __restrict__ x, const float* __restrict__ dout, float* __restrict__ dx, unsigned short* __restrict__ dx_h, int n) {
    long stride = (long)gridDim.x * blockDim.x, start = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n4 = al16(x) && al16(dout) && al16(dx) && al8(dx_h) ? n / 4 : 0;
    for (long i = start; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4*>(x)[i], d = reinterpret_cast<const float4*>(dout)[i];
        float4 o = make_float4(gelu_grad(v.x, d.x), gelu_grad(v.y, d.y), gelu_grad(v.z, d.z), gelu_grad(v.w, d.w));
        store4(dx, dx_h, i, o);
    }
    for (long i = n4 * 4 + start; i < n; i += stride) {
        float o = gelu_grad(x[i], dout[i]);
        dx[i] = o; dx_h[i] = (unsigned short)bf16_bits(o);
    }
}
// The fused MLP's GELU backward on bf16 (its product wrote d_h alone, its forward x_h):
// dx_h = GELU'(x_h) d_h, and part[chunk * cols + j] the f32 sum of column j of dx (before its
// rounding) over rows [chunk * per, (chunk + 1) * per), for col_finish. Eight columns per
// thread (16-byte loads; cols % 8 == 0, rows 16-byte aligned), block (32, 8) over 256 columns,
// grid (column blocks, chunks).
__device__ __forceinline__ float lo_bf16(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi_bf16(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
extern "C" __global__ void dgelu_h_part(const uint4* __restrict__ x_h, const uint4* __restrict__ d_h, uint4* __restrict__ dx_h, float* __restrict__ part, int rows, int cols, int per) {
    __shared__ float sh[8][257];
    int groups = cols / 8, q = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
    float s[8];
#pragma unroll
    for (int k = 0; k < 8; k++) s[k] = 0.f;
    if (q < groups) for (int r = r0 + threadIdx.y; r < r1; r += 8) {
        long i = (long)r * groups + q;
        uint4 xv = x_h[i], dv = d_h[i];
        unsigned xs[4] = {xv.x, xv.y, xv.z, xv.w}, ds[4] = {dv.x, dv.y, dv.z, dv.w}, os[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float g0 = gelu_grad(lo_bf16(xs[k]), lo_bf16(ds[k])), g1 = gelu_grad(hi_bf16(xs[k]), hi_bf16(ds[k]));
            s[2 * k] += g0;
            s[2 * k + 1] += g1;
            os[k] = bf16_bits(g0) | (bf16_bits(g1) << 16);
        }
        dx_h[i] = make_uint4(os[0], os[1], os[2], os[3]);
    }
#pragma unroll
    for (int k = 0; k < 8; k++) sh[threadIdx.y][threadIdx.x * 8 + k] = s[k];
    __syncthreads();
    int t = threadIdx.y * 32 + threadIdx.x, j = blockIdx.x * 256 + t;
    if (j < cols) {
        float acc = 0.f;
        for (int k = 0; k < 8; k++) acc += sh[k][t];
        part[(long)blockIdx.y * cols + j] = acc;
    }
}
// NaN passes through (fmaxf would drop it).
extern "C" __global__ void relu_fwd(const float* x, float* out, int n) { int i = IDX; if (i < n) out[i] = x[i] < 0.f ? 0.f : x[i]; }
extern "C" __global__ void relu_bwd(const float* y, const float* dout, float* dx, int n) {
    int i = IDX; if (i < n) dx[i] = y[i] > 0.f ? dout[i] : 0.f;
}
extern "C" __global__ void cross_entropy(const float* logits, const float* targets, float* dlogits, float* losses, int rows, int v) {
    ROW_WARP
    if (row >= rows) return;
    long o = (long)row * v;
    float m = NEG_INF;
    for (int j = lane; j < v; j += 32) m = fmaxf(m, logits[o + j]);
    m = warp_max(m);
    float sum = 0.f;
    for (int j = lane; j < v; j += 32) sum += __expf(logits[o + j] - m);
    sum = warp_sum(sum);
    int tgt = (int)targets[row];
    for (int j = lane; j < v; j += 32)
        dlogits[o + j] = (__expf(logits[o + j] - m) / sum - (j == tgt ? 1.f : 0.f)) / rows;
    if (lane == 0) losses[row] = -(logits[o + tgt] - m - logf(sum));
}
// The parameter and its bf16 twin p_h (what the next step's products read).
// One AdamW update of element i (fp32 master weight, moments, and the weight's bf16 twin).
struct AdamArgs { float lr, b1, b2, eps, wd, c1, c2, gs; };
__device__ __forceinline__ void adam1(float& p, float g, float& m, float& v, const AdamArgs& a) {
    float gi = g * a.gs;
    m = a.b1 * m + (1.f - a.b1) * gi;
    v = a.b2 * v + (1.f - a.b2) * gi * gi;
    p = p - a.lr * ((m / a.c1) / (sqrtf(v / a.c2) + a.eps) + a.wd * p);
}
// One thread per four elements (a grid-stride loop), as float4s when every buffer allows.
extern "C" __global__ void adamw(float* __restrict__ p, unsigned short* __restrict__ p_h, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, int n, float lr, float b1, float b2, float eps, float wd, float c1, float c2, float gs) {
    AdamArgs a = {lr, b1, b2, eps, wd, c1, c2, gs};
    long stride = (long)gridDim.x * blockDim.x, start = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long n4 = al16(p) && al8(p_h) && al16(g) && al16(m) && al16(v) ? n / 4 : 0;
    for (long i = start; i < n4; i += stride) {
        float4 pp = reinterpret_cast<float4*>(p)[i], gg = reinterpret_cast<const float4*>(g)[i];
        float4 mm = reinterpret_cast<float4*>(m)[i], vv = reinterpret_cast<float4*>(v)[i];
        adam1(pp.x, gg.x, mm.x, vv.x, a);
        adam1(pp.y, gg.y, mm.y, vv.y, a);
        adam1(pp.z, gg.z, mm.z, vv.z, a);
        adam1(pp.w, gg.w, mm.w, vv.w, a);
        reinterpret_cast<float4*>(m)[i] = mm;
        reinterpret_cast<float4*>(v)[i] = vv;
        store4(p, p_h, i, pp);
    }
    for (long i = n4 * 4 + start; i < n; i += stride) {
        float pi = p[i], mi = m[i], vi = v[i];
        adam1(pi, g[i], mi, vi, a);
        m[i] = mi; v[i] = vi; p[i] = pi; p_h[i] = (unsigned short)bf16_bits(pi);
    }
}
// cols [c k k, n oh ow] from x [c, n h w].
extern "C" __global__ void im2col(const float* x, float* cols, int c, int n, int h, int w, int k, int stride, int pad, int oh, int ow) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long ncols = (long)n * oh * ow;
    if (i >= (long)c * k * k * ncols) return;
    int row = i / ncols; long col = i % ncols;
    int ch = row / (k * k), ky = (row / k) % k, kx = row % k;
    int b = col / (oh * ow), oy = (col / ow) % oh, ox = col % ow;
    int iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;
    cols[i] = (iy >= 0 && ix >= 0 && iy < h && ix < w) ? x[((long)ch * n + b) * h * w + iy * w + ix] : 0.f;
}
// dx [c, n h w] gathered from dcols: each input element sums the taps that read it.
extern "C" __global__ void col2im(const float* dcols, float* dx, int c, int n, int h, int w, int k, int stride, int pad, int oh, int ow) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)c * n * h * w) return;
    int ix = i % w, iy = (i / w) % h, b = (i / ((long)h * w)) % n, ch = i / ((long)n * h * w);
    long ncols = (long)n * oh * ow;
    float s = 0.f;
    for (int ky = 0; ky < k; ky++) {
        int ty = iy + pad - ky;
        if (ty < 0 || ty % stride) continue;
        int oy = ty / stride; if (oy >= oh) continue;
        for (int kx = 0; kx < k; kx++) {
            int tx = ix + pad - kx;
            if (tx < 0 || tx % stride) continue;
            int ox = tx / stride; if (ox >= ow) continue;
            s += dcols[((long)(ch * k + ky) * k + kx) * ncols + ((long)b * oh + oy) * ow + ox];
        }
    }
    dx[i] = s;
}
// Batch norm over rows of m elements, in two kernels on a grid (chunks, channels) of blocks of
// 256, each block a chunk of `per` elements of its channel. The second kernel's blocks each sum
// their channel's parts in chunk order (no atomics: the same result every time).
// Statistics: sums of x - K and (x - K)^2, K the channel's first element (shifted sums: no
// cancellation when the mean is large against the spread).
extern "C" __global__ void bn_stats(const float* x, float* part, int m, int per) {
    __shared__ float sh[32];
    int ch = blockIdx.y; long o = (long)ch * m, at = ((long)ch * gridDim.x + blockIdx.x) * 2;
    int j0 = blockIdx.x * per, j1 = min(m, j0 + per);
    float k = x[o], s1 = 0.f, s2 = 0.f;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) { float d = x[o + j] - k; s1 += d; s2 += d * d; }
    s1 = block_sum(s1, sh);
    s2 = block_sum(s2, sh);
    if (threadIdx.x == 0) { part[at] = s1; part[at + 1] = s2; }
}
// The sums of channel ch's parts, in chunk order, in double.
__device__ void bn_sums(const float* part, int ch, int chunks, double* a, double* b) {
    double s1 = 0.0, s2 = 0.0;
    for (int k = 0; k < chunks; k++) { long at = ((long)ch * chunks + k) * 2; s1 += part[at]; s2 += part[at + 1]; }
    *a = s1; *b = s2;
}
extern "C" __global__ void bn_apply(const float* x, const float* g, const float* b, const float* part, float* out, float* mean, float* rstd, int m, int per) {
    __shared__ float stat[2];
    int ch = blockIdx.y; long o = (long)ch * m;
    if (threadIdx.x == 0) {
        double s1, s2;
        bn_sums(part, ch, gridDim.x, &s1, &s2);
        double mu = s1 / m, var = s2 / m - mu * mu;
        stat[0] = x[o] + (float)mu;
        stat[1] = rsqrtf((float)(var > 0.0 ? var : 0.0) + EPS);
        if (blockIdx.x == 0) { mean[ch] = stat[0]; rstd[ch] = stat[1]; }
    }
    __syncthreads();
    float mu = stat[0], gr = g[ch] * stat[1], bb = b[ch];
    int j0 = blockIdx.x * per, j1 = min(m, j0 + per);
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) out[o + j] = (x[o + j] - mu) * gr + bb;
}
// Backward: the parts of sum dout and of sum dout * xhat.
extern "C" __global__ void bn_bwd_part(const float* x, const float* mean, const float* rstd, const float* dout, float* part, int m, int per) {
    __shared__ float sh[32];
    int ch = blockIdx.y; long o = (long)ch * m, at = ((long)ch * gridDim.x + blockIdx.x) * 2;
    float mu = mean[ch], rs = rstd[ch], a = 0.f, b = 0.f;
    int j0 = blockIdx.x * per, j1 = min(m, j0 + per);
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) { float d = dout[o + j]; a += d; b += d * (x[o + j] - mu) * rs; }
    a = block_sum(a, sh);
    b = block_sum(b, sh);
    if (threadIdx.x == 0) { part[at] = a; part[at + 1] = b; }
}
extern "C" __global__ void bn_bwd_apply(const float* x, const float* g, const float* mean, const float* rstd, const float* dout, const float* part, float* dx, float* dg, float* db, int m, int per) {
    __shared__ float stat[2];
    int ch = blockIdx.y; long o = (long)ch * m;
    if (threadIdx.x == 0) {
        double a, b;
        bn_sums(part, ch, gridDim.x, &a, &b);
        stat[0] = (float)(a / m); stat[1] = (float)(b / m);
        if (blockIdx.x == 0) { db[ch] = (float)a; dg[ch] = (float)b; }
    }
    __syncthreads();
    float a = stat[0], b = stat[1], mu = mean[ch], rs = rstd[ch], gr = g[ch] * rs;
    int j0 = blockIdx.x * per, j1 = min(m, j0 + per);
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x)
        dx[o + j] = gr * (dout[o + j] - a - (x[o + j] - mu) * rs * b);
}
extern "C" __global__ void maxpool_fwd(const float* x, float* out, float* arg, int cn, int h, int w, int k, int stride, int pad, int oh, int ow) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)cn * oh * ow) return;
    int ox = i % ow, oy = (i / ow) % oh; long plane = i / ((long)oh * ow);
    float best = NEG_INF; long at = 0;
    for (int ky = 0; ky < k; ky++) for (int kx = 0; kx < k; kx++) {
        int iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;
        if (iy < 0 || ix < 0 || iy >= h || ix >= w) continue;
        int j = iy * w + ix;
        if (x[plane * h * w + j] > best || isnan(x[plane * h * w + j])) { best = x[plane * h * w + j]; at = j; }
    }
    out[i] = best; arg[i] = (float)at;
}
// arg: the source's place in its h x w plane (exact in f32).
// Max pooling's input gradient, gathered: each input element sums the gradients of the windows
// whose maximum it is, in the windows' order (the CPU backend's order). Windows overlap (3x3
// stride 2), and adding them with atomics would sum in a different order each run: the same
// step would give different weights from run to run.
extern "C" __global__ void maxpool_bwd(const float* __restrict__ dout, const float* __restrict__ arg, float* __restrict__ dx, int cn, int h, int w, int k, int stride, int pad, int oh, int ow) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)cn * h * w) return;
    int j = (int)(i % ((long)h * w)), iy = j / w, ix = j % w;
    long plane = i / ((long)h * w);
    // The windows that hold (iy, ix): oy * stride - pad <= iy < oy * stride - pad + k.
    int oy0 = max(0, (iy + pad - k + stride) / stride), oy1 = min(oh - 1, (iy + pad) / stride);
    int ox0 = max(0, (ix + pad - k + stride) / stride), ox1 = min(ow - 1, (ix + pad) / stride);
    const float *a = arg + plane * oh * ow, *d = dout + plane * oh * ow;
    float sum = 0.f;
    for (int oy = oy0; oy <= oy1; oy++)
        for (int ox = ox0; ox <= ox1; ox++) {
            int o = oy * ow + ox;
            if ((int)a[o] == j) sum += d[o];
        }
    dx[i] = sum;
}
// out [n, c] = mean over hw of x [c, n hw].
extern "C" __global__ void avgpool_fwd(const float* x, float* out, int c, int n, int hw) {
    int i = IDX; if (i >= c * n) return;
    int b = i / c, ch = i % c;
    const float* p = x + ((long)ch * n + b) * hw;
    float s = 0.f;
    for (int j = 0; j < hw; j++) s += p[j];
    out[i] = s / hw;
}
extern "C" __global__ void avgpool_bwd(const float* dout, float* dx, int c, int n, int hw) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)c * n * hw) return;
    long cb = i / hw; int ch = cb / n, b = cb % n;
    dx[i] = dout[b * c + ch] / hw;
}
