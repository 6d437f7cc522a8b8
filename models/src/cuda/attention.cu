// Fused causal self-attention, flash-style: the t x t scores never reach memory. Compiled at run
// time by NVRTC with D defined (the head dimension; DP is D rounded up to a multiple of 16, the
// padding features are zeros in shared memory and never stored), for sm_80 and newer (bf16
// mma.sync, cp.async).
//
// Layouts (ops.rs): qkv [b t, 3, h, d] (queries, keys, values), y and dy [b t, h, d], lse and
// delta [b h, t]. The products read bf16 copies of qkv and dy (the backend's twins) and run on
// bf16 tensor cores (m16n8k16) with fp32 accumulation; the softmax statistics, the output and
// every gradient are fp32. Tiles reach shared memory by asynchronous copies (cp.async), the next
// tile's while the warps compute on this one (two stages). The forward keeps each row's log-sum-exp (natural log) for the
// backward, which recomputes the probabilities tile by tile (FlashAttention-2's scheme): one
// kernel for the queries' gradient (a block per query tile, over its key tiles), one for the keys'
// and values' (a block per key tile, over its query tiles), so every gradient is summed in a
// fixed order (no atomics).
//
// Warp-level building blocks: mma.sync m16n8k16 (row.col, bf16 in, f32 accumulators) and
// ldmatrix for the operand fragments. Fragment layout (PTX ISA, "mma.m16n8k16"): lane l, group
// g = l / 4, thread t = l % 4; an accumulator c[0..1] is row g, columns 2t and 2t+1, c[2..3] row
// g + 8; an A fragment a[0] is row g, k 2t..2t+1, a[1] row g + 8, a[2] row g, k 8 + 2t, a[3] row
// g + 8, k 8 + 2t. So the accumulators of two adjacent 8-column tiles are, once packed to bf16,
// the A fragment of one 16-deep k step: probabilities feed the next product from registers.

#ifndef D
#error "D (the head dimension) must be defined"
#endif
#ifndef WARPS
#error "WARPS (warps per block, 16 rows each) must be defined"
#endif
#define DP ((D + 15) / 16 * 16)
#define DS (DP + 8)  // shared row stride in bf16: 16 bytes of padding keep ldmatrix conflict-free
#define NT (32 * WARPS)  // threads of every attention block
#define BQ (16 * WARPS)  // queries per block of the forward and the queries' gradient
#define BKB (16 * WARPS) // keys per block of the keys' gradient
#define BK 64        // keys per stage of the forward
#define BK_DQ 32     // keys per stage of the queries' gradient
#define BQ_DKV 32    // queries per stage of the keys' gradient
#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef unsigned short bf16_t;
typedef unsigned int u32;

// Two floats as bf16x2 (round to nearest even; NaN stays NaN): lo in the low half.
__device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// 2^x by the special function unit (relative error below 2^-22; -inf gives 0, NaN stays NaN):
// exp2f's care for subnormal results would cost three more instructions per probability.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ u32 shared_addr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}
// c += a b for one 16 x 8 tile, k 16.
__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Shared memory is addressed by 32-bit byte addresses in the shared window (a tile's address plus
// constant offsets once the loops unroll): generic pointers would cost 64-bit arithmetic and a
// conversion at every ldmatrix and copy.
__device__ __forceinline__ void ldsm4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4_t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The byte offset of element (row, col) of a shared tile.
#define AT(row, col) (u32)(((row) * DS + (col)) * 2)
// The A fragment (16 x 16) at (m0, k0) of a shared row-major [m][k] tile at s.
__device__ __forceinline__ void frag_a(u32* a, u32 s, int m0, int k0, int lane) {
    ldsm4(a, s + AT(m0 + (lane & 15), k0 + 8 * (lane >> 4)));
}
// B fragments of two 8-column tiles (n0 and n0 + 8, k0..k0+15) of a shared row-major [n][k]
// tile: b[0..1] for n0, b[2..3] for n0 + 8.
__device__ __forceinline__ void frag_b_nk(u32* b, u32 s, int n0, int k0, int lane) {
    ldsm4(b, s + AT(n0 + (lane & 7) + 8 * (lane >> 4), k0 + 8 * ((lane >> 3) & 1)));
}
// The same from a shared row-major [k][n] tile (ldmatrix transposes).
__device__ __forceinline__ void frag_b_kn(u32* b, u32 s, int k0, int n0, int lane) {
    ldsm4_t(b, s + AT(k0 + (lane & 7) + 8 * ((lane >> 3) & 1), n0 + 8 * (lane >> 4)));
}
// The A fragment of the 16-deep k step kk from accumulators of 8-column tiles 2kk and 2kk + 1.
__device__ __forceinline__ void acc_to_a(u32* a, const float* c0, const float* c1) {
    a[0] = pack(c0[0], c0[1]);
    a[1] = pack(c0[2], c0[3]);
    a[2] = pack(c1[0], c1[1]);
    a[3] = pack(c1[2], c1[3]);
}
// acc[n] and acc[n + 1] += a times the B fragments bb of 8-column tiles n and n + 1 (as
// frag_b_nk and frag_b_kn give them).
__device__ __forceinline__ void mma2(float (*acc)[4], int n, const u32* a, const u32* bb) {
    mma(acc[n], a, bb[0], bb[1]);
    mma(acc[n + 1], a, bb[2], bb[3]);
}
// A warp's 16 rows x DP accumulators += a (16 x 16) times rows k0..k0+15 of a shared [k][n]
// tile of DP columns.
__device__ __forceinline__ void mma_rows(float (*acc)[4], const u32* a, u32 s, int k0, int lane) {
#pragma unroll
    for (int n = 0; n < DP / 8; n += 2) {
        u32 bb[4];
        frag_b_kn(bb, s, k0, n * 8, lane);
        mma2(acc, n, a, bb);
    }
}
template <int N>
__device__ __forceinline__ void zero(float (*acc)[4]) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// Masks a warp's N 8-column tiles of scores (rows r0 + g and r0 + g + 8, columns c0 + 8 n + 2 t
// and the next) to -inf where the key does not see the query or either is at or past t. Rows are
// queries and columns keys (the forward, the queries' gradient), or the other way round
// (`rows_are_keys`: the keys' gradient's transposed scores). Called only for the tiles that
// cross the diagonal or t: every other tile is wholly seen, and skips the per-element tests.
template <int N>
__device__ __forceinline__ void mask(float (*s)[4], int r0, int c0, int t, int lane, bool rows_are_keys) {
    int g = lane >> 2, c2 = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = r0 + g + (e >= 2 ? 8 : 0), col = c0 + n * 8 + c2 + (e & 1);
            int key = rows_are_keys ? row : col, query = rows_are_keys ? col : row;
            if (key > query || query >= t || key >= t) s[n][e] = NEG_INF;
        }
    }
}

__device__ __forceinline__ void cp_async16(u32 dst, const bf16_t* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(u32 dst, const float* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void sts16(u32 dst, bf16_t v) {
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(v));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most one group of copies (the one just started) is still in flight.
__device__ __forceinline__ void cp_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

#define CH (DP / 8)    // 16-byte chunks of a padded head row
// Starts staging ROWS rows of a head into the shared tile at s: tile row i is sequence row
// r0 + i of `src` (row stride ld), its D features; rows at or past t and features D..DP are
// zeros. The whole block takes part; the copies land by the next cp_wait.
template <int ROWS>
__device__ __forceinline__ void stage(u32 s, const bf16_t* src, long ld, int r0, int t) {
#if D % 8 == 0 && NT % ((D + 15) / 16 * 2) == 0
    // 16-byte copies (every head row starts 16-byte aligned), the zero fill by copying 0 bytes.
    // Each thread keeps one chunk column and walks rows STEP apart: its addresses are computed
    // once, the unrolled copies differ by constants.
    constexpr int STEP = NT / CH;
    int r = threadIdx.x / CH, c = (threadIdx.x % CH) * 8;
    const bf16_t* p = src + (long)(r0 + r) * ld + c;
    u32 dst = s + AT(r, c);
    bool col_in = c < D;
#pragma unroll
    for (int j = 0; j < (ROWS + STEP - 1) / STEP; j++) {
        if (ROWS % STEP == 0 || r + j * STEP < ROWS) {
            bool in = col_in && r0 + r + j * STEP < t;
            cp_async16(dst + AT(j * STEP, 0), in ? p + (long)j * STEP * ld : src, in ? 16 : 0);
        }
    }
#elif D % 8 == 0
    // Chunks that do not divide the block evenly: the general walk.
    for (int i = threadIdx.x; i < ROWS * CH; i += NT) {
        int r = i / CH, c = (i % CH) * 8;
        bool in = r0 + r < t && c < D;
        cp_async16(s + AT(r, c), in ? src + (long)(r0 + r) * ld + c : src, in ? 16 : 0);
    }
#else
    // Rows not 16-byte aligned: element by element, synchronously.
    for (int i = threadIdx.x; i < ROWS * DP; i += NT) {
        int r = i / DP, c = i % DP;
        sts16(s + AT(r, c), r0 + r < t && c < D ? src[(long)(r0 + r) * ld + c] : (bf16_t)0);
    }
#endif
}
// Starts copying ROWS per-row floats (r0.., zeros at or past t) to the shared address s.
template <int ROWS>
__device__ __forceinline__ void stage_rows(u32 s, const float* src, int r0, int t) {
    for (int i = threadIdx.x; i < ROWS; i += NT) {
        bool in = r0 + i < t;
        cp_async4(s + 4 * i, in ? src + r0 + i : src, in ? 4 : 0);
    }
}
// Features col and col + 1 of a head row straight from global memory, as bf16x2 (zeros past t
// or D).
__device__ __forceinline__ u32 pair(const bf16_t* src, long ld, int row, int col, int t) {
    if (row >= t || col >= D) return 0u;
    const bf16_t* p = src + (long)row * ld + col;
#if D % 2 == 0
    return *reinterpret_cast<const u32*>(p);
#else
    return (u32)p[0] | (col + 1 < D ? (u32)p[1] << 16 : 0u);
#endif
}
// A warp's A fragments of its 16 rows (r0..r0+15) x DP features, straight from global memory.
__device__ __forceinline__ void frags_from_global(u32 (*a)[4], const bf16_t* src, long ld, int r0, int t, int lane) {
    int g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        int k = kk * 16 + c;
        a[kk][0] = pair(src, ld, r0 + g, k, t);
        a[kk][1] = pair(src, ld, r0 + g + 8, k, t);
        a[kk][2] = pair(src, ld, r0 + g, k + 8, t);
        a[kk][3] = pair(src, ld, r0 + g + 8, k + 8, t);
    }
}
// Stores a warp's accumulators of rows r0..r0+15 x DP features (times the row's factor) into
// a head's rows of dst (row stride ld), the D features of the rows before t, and the same as
// bf16 at the same places of dst_h (dst's twin, which the next product reads).
__device__ __forceinline__ void store_rows(float* dst, bf16_t* dst_h, long ld, const float (*acc)[4], int r0, int t,
                                           int lane, float f0, float f1) {
    int g = lane >> 2, c = 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
        int col = n * 8 + c;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = r0 + g + (e >= 2 ? 8 : 0), cc = col + (e & 1);
            if (row < t && cc < D) {
                float v = acc[n][e] * (e >= 2 ? f1 : f0);
                dst[(long)row * ld + cc] = v;
                dst_h[(long)row * ld + cc] = (bf16_t)(pack(v, 0.f) & 0xffffu);
            }
        }
    }
}

// The head of block (sequence b, head hh): pointers to its first row's queries, keys and values
// (row stride 3 h d), and its rows of the output-shaped tensors (row stride h d).
#define HEAD                                                                                  \
    const int d = D;                                                                          \
    int bh = blockIdx.y, b = bh / h, hh = bh % h;                                             \
    long ld3 = 3L * h * d, ld1 = (long)h * d;                                                 \
    long qoff = (long)b * t * ld3 + (long)hh * d, yoff = (long)b * t * ld1 + (long)hh * d;    \
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3); \
    (void)g; (void)c2;

// Grid (query tiles, b h), NT threads, dynamic shared memory of two stages of BK keys and
// values (fwd_shared in attention.rs). sl2 = scale log2(e). Writes y, its bf16 twin and lse.
// Four warps: three blocks per SM (at most 168 registers); eight: one block (up to 255).
extern "C" __global__ void __launch_bounds__(NT, WARPS == 4 ? 3 : 1) attn_fwd(const bf16_t* qkv, float* y, bf16_t* y_h, float* lse, int t,
                                                           int h, float sl2) {
    extern __shared__ __align__(16) bf16_t sm[];
    HEAD
    int nqt = (t + BQ - 1) / BQ, qt = nqt - 1 - blockIdx.x;  // the longest rows first
    const bf16_t *qb = qkv + qoff, *kb = qb + (long)h * d, *vb = qb + 2L * h * d;
    int q0 = qt * BQ + warp * 16, row0 = q0 + g, row1 = row0 + 8;
    const u32 smb = shared_addr(sm), kv = 2 * AT(BK, 0);  // a stage: keys, then values
    stage<BK>(smb, kb, ld3, 0, t);
    stage<BK>(smb + AT(BK, 0), vb, ld3, 0, t);
    cp_commit();
    u32 qf[DP / 16][4];
    frags_from_global(qf, qb, ld3, q0, t, lane);
    float o[DP / 8][4];
    zero<DP / 8>(o);
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    int tiles = (min(t, (qt + 1) * BQ) + BK - 1) / BK;
    for (int kt = 0; kt < tiles; kt++) {
        const u32 ks = smb + (kt & 1) * kv, vs = ks + AT(BK, 0);
        int k0 = kt * BK;
        if (kt + 1 < tiles) {
            const u32 next = smb + ((kt + 1) & 1) * kv;
            stage<BK>(next, kb, ld3, (kt + 1) * BK, t);
            stage<BK>(next + AT(BK, 0), vb, ld3, (kt + 1) * BK, t);
            cp_commit();
            cp_wait_all_but_one();
        } else {
            cp_wait_all();
        }
        __syncthreads();
        if (k0 <= q0 + 15) {  // else every key of the tile comes after this warp's rows
            float s[BK / 8][4];
            zero<BK / 8>(s);
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) {
#pragma unroll
                for (int n = 0; n < BK / 8; n += 2) {
                    u32 bb[4];
                    frag_b_nk(bb, ks, n * 8, kk * 16, lane);
                    mma2(s, n, qf[kk], bb);
                }
            }
            // A tile with a key after one of the warp's rows, or past t, is masked.
            if (k0 + BK - 1 > q0 || k0 + BK > t) mask<BK / 8>(s, q0, k0, t, lane, false);
            // The running maxima m are of the scores times sl2 (> 0: the same order as the scores).
            float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
            for (int n = 0; n < BK / 8; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
            }
            float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
            // Every row before t sees key 0 of the first tile, so from there on mn is finite
            // unless the scores are NaN; then the NaN still reaches the output through the
            // probabilities.
            float base0 = mn0 == NEG_INF ? 0.f : mn0, base1 = mn1 == NEG_INF ? 0.f : mn1;
            float al0 = ex2(m0 - base0), al1 = ex2(m1 - base1);
            m0 = mn0;
            m1 = mn1;
            float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
            for (int n = 0; n < BK / 8; n++) {
                s[n][0] = ex2(fmaf(s[n][0], sl2, -base0));
                s[n][1] = ex2(fmaf(s[n][1], sl2, -base0));
                s[n][2] = ex2(fmaf(s[n][2], sl2, -base1));
                s[n][3] = ex2(fmaf(s[n][3], sl2, -base1));
                rs0 += s[n][0] + s[n][1];
                rs1 += s[n][2] + s[n][3];
            }
            l0 = l0 * al0 + rs0;
            l1 = l1 * al1 + rs1;
#pragma unroll
            for (int n = 0; n < DP / 8; n++) {
                o[n][0] *= al0;
                o[n][1] *= al0;
                o[n][2] *= al1;
                o[n][3] *= al1;
            }
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                u32 pa[4];
                acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
                mma_rows(o, pa, vs, kk * 16, lane);
            }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    store_rows(y + yoff, y_h + yoff, ld1, o, q0, t, lane, 1.f / l0, 1.f / l1);
    if ((lane & 3) == 0) {
        if (row0 < t) lse[(long)bh * t + row0] = (m0 + log2f(l0)) * LN2;
        if (row1 < t) lse[(long)bh * t + row1] = (m1 + log2f(l1)) * LN2;
    }
}

// delta[b h, i] = dy_i . y_i of each head row (fp32): one warp per row and head (grid of b t h
// warps, 4 per block).
extern "C" __global__ void attn_delta(const float* y, const float* dy, float* delta, int t, int h, int rows) {
    const int d = D;
    int w = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= rows) return;
    int hh = w % h, r = w / h, b = r / t, i = r % t;
    const float *yr = y + (long)r * h * d + (long)hh * d, *dr = dy + (long)r * h * d + (long)hh * d;
    float v = 0.f;
    for (int j = lane; j < d; j += 32) v += yr[j] * dr[j];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (lane == 0) delta[((long)b * h + hh) * t + i] = v;
}

// The queries' gradient: grid (query tiles, b h), NT threads, dynamic shared memory of two
// stages of BK_DQ keys and values; each warp's 16 query rows go over the keys they see.
// dq = scale dS K with dS = P (dP - delta), dP = dy V^T. Overwrites the queries' part of dqkv
// (and of its bf16 twin). qkv and dy are the bf16 copies.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dq(const bf16_t* qkv, const bf16_t* dy, const float* lse,
                                                              const float* delta, float* dqkv, bf16_t* dqkv_h, int t,
                                                              int h, float sl2, float scale) {
    extern __shared__ __align__(16) bf16_t sm[];
    HEAD
    int nqt = (t + BQ - 1) / BQ, qt = nqt - 1 - blockIdx.x;
    const bf16_t *qb = qkv + qoff, *kb = qb + (long)h * d, *vb = qb + 2L * h * d;
    int q0 = qt * BQ + warp * 16, row0 = q0 + g, row1 = row0 + 8;
    const u32 smb = shared_addr(sm), kv = 2 * AT(BK_DQ, 0);  // a stage: keys, then values
    stage<BK_DQ>(smb, kb, ld3, 0, t);
    stage<BK_DQ>(smb + AT(BK_DQ, 0), vb, ld3, 0, t);
    cp_commit();
    u32 qf[DP / 16][4], df[DP / 16][4];
    frags_from_global(qf, qb, ld3, q0, t, lane);
    frags_from_global(df, dy + yoff, ld1, q0, t, lane);
    long st = (long)bh * t;
    float L0 = row0 < t ? lse[st + row0] * LOG2E : 0.f, L1 = row1 < t ? lse[st + row1] * LOG2E : 0.f;
    float D0 = row0 < t ? delta[st + row0] : 0.f, D1 = row1 < t ? delta[st + row1] : 0.f;
    float dq[DP / 8][4];
    zero<DP / 8>(dq);
    int stages = (min(t, (qt + 1) * BQ) + BK_DQ - 1) / BK_DQ;
    for (int i = 0; i < stages; i++) {
        int k0 = i * BK_DQ;
        const u32 ks = smb + (i & 1) * kv, vs = ks + AT(BK_DQ, 0);
        if (i + 1 < stages) {
            const u32 next = smb + ((i + 1) & 1) * kv;
            stage<BK_DQ>(next, kb, ld3, k0 + BK_DQ, t);
            stage<BK_DQ>(next + AT(BK_DQ, 0), vb, ld3, k0 + BK_DQ, t);
            cp_commit();
            cp_wait_all_but_one();
        } else {
            cp_wait_all();
        }
        __syncthreads();
        if (k0 <= q0 + 15) {  // else every key of the stage comes after this warp's rows
            float s[BK_DQ / 8][4], dp[BK_DQ / 8][4];
            zero<BK_DQ / 8>(s);
            zero<BK_DQ / 8>(dp);
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) {
#pragma unroll
                for (int n = 0; n < BK_DQ / 8; n += 2) {
                    u32 bb[4];
                    frag_b_nk(bb, ks, n * 8, kk * 16, lane);
                    mma2(s, n, qf[kk], bb);
                    frag_b_nk(bb, vs, n * 8, kk * 16, lane);
                    mma2(dp, n, df[kk], bb);
                }
            }
            // A stage with a key after one of the warp's rows, or past t, is masked.
            if (k0 + BK_DQ - 1 > q0 || k0 + BK_DQ > t) mask<BK_DQ / 8>(s, q0, k0, t, lane, false);
#pragma unroll
            for (int n = 0; n < BK_DQ / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    // exp2(-inf) = 0 for the masked scores.
                    float p = ex2(fmaf(s[n][e], sl2, -(e >= 2 ? L1 : L0)));
                    s[n][e] = p * (dp[n][e] - (e >= 2 ? D1 : D0)) * scale;
                }
            }
#pragma unroll
            for (int kk = 0; kk < BK_DQ / 16; kk++) {
                u32 a[4];
                acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
                mma_rows(dq, a, ks, kk * 16, lane);
            }
        }
        __syncthreads();
    }
    store_rows(dqkv + qoff, dqkv_h + qoff, ld3, dq, q0, t, lane, 1.f, 1.f);
}

// The keys' and values' gradients: grid (key tiles, b h), NT threads, dynamic shared memory of
// the block's BKB keys and values and two stages of BQ_DKV queries, output gradients,
// log-sum-exps and deltas (dkv_shared in attention.rs). Each warp's 16 key rows go over the
// queries that see them with the transposed scores S^T = K Q^T in its accumulators:
// dv += P^T dy, dk += scale dS^T Q. Overwrites the keys' and values' parts of dqkv (and of its
// bf16 twin). qkv and dy are the bf16 copies.
extern "C" __global__ void __launch_bounds__(NT) attn_bwd_dkv(const bf16_t* qkv, const bf16_t* dy, const float* lse,
                                                               const float* delta, float* dqkv, bf16_t* dqkv_h,
                                                               int t, int h, float sl2, float scale) {
    extern __shared__ __align__(16) bf16_t sm[];
    const u32 step = 2 * AT(BQ_DKV, 0);  // one stage: queries, then output gradients
    const u32 ks = shared_addr(sm), vs = ks + AT(BKB, 0), stages = vs + AT(BKB, 0), rows_at = stages + 2 * step;
    const float* rows = reinterpret_cast<const float*>(sm + 2 * BKB * DS + 4 * BQ_DKV * DS);  // per stage: lse, then delta
    HEAD
    const bf16_t *qb = qkv + qoff, *kb = qb + (long)h * d, *vb = qb + 2L * h * d, *dyb = dy + yoff;
    int kt = blockIdx.x, kw = kt * BKB + warp * 16;
    long st = (long)bh * t;
    stage<BKB>(ks, kb, ld3, kt * BKB, t);
    stage<BKB>(vs, vb, ld3, kt * BKB, t);
    stage<BQ_DKV>(stages, qb, ld3, kt * BKB, t);
    stage<BQ_DKV>(stages + AT(BQ_DKV, 0), dyb, ld1, kt * BKB, t);
    stage_rows<BQ_DKV>(rows_at, lse + st, kt * BKB, t);
    stage_rows<BQ_DKV>(rows_at + 4 * BQ_DKV, delta + st, kt * BKB, t);
    cp_commit();
    float dk[DP / 8][4], dv[DP / 8][4];
    zero<DP / 8>(dk);
    zero<DP / 8>(dv);
    int count = (t - kt * BKB + BQ_DKV - 1) / BQ_DKV;
    for (int i = 0; i < count; i++) {
        int q0 = kt * BKB + i * BQ_DKV;
        const u32 qs = stages + (i & 1) * step, dos = qs + AT(BQ_DKV, 0);
        const float *ls = rows + (i & 1) * 2 * BQ_DKV, *dl = ls + BQ_DKV;
        if (i + 1 < count) {
            const u32 next = stages + ((i + 1) & 1) * step, nrows = rows_at + ((i + 1) & 1) * 8 * BQ_DKV;
            stage<BQ_DKV>(next, qb, ld3, q0 + BQ_DKV, t);
            stage<BQ_DKV>(next + AT(BQ_DKV, 0), dyb, ld1, q0 + BQ_DKV, t);
            stage_rows<BQ_DKV>(nrows, lse + st, q0 + BQ_DKV, t);
            stage_rows<BQ_DKV>(nrows + 4 * BQ_DKV, delta + st, q0 + BQ_DKV, t);
            cp_commit();
            cp_wait_all_but_one();
        } else {
            cp_wait_all();
        }
        __syncthreads();
        if (q0 + BQ_DKV - 1 >= kw) {  // else every query of the stage comes before this warp's keys
            float s[BQ_DKV / 8][4], dp[BQ_DKV / 8][4];
            zero<BQ_DKV / 8>(s);
            zero<BQ_DKV / 8>(dp);
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) {
                u32 ka[4], va[4];
                frag_a(ka, ks, warp * 16, kk * 16, lane);
                frag_a(va, vs, warp * 16, kk * 16, lane);
#pragma unroll
                for (int n = 0; n < BQ_DKV / 8; n += 2) {
                    u32 bb[4];
                    frag_b_nk(bb, qs, n * 8, kk * 16, lane);
                    mma2(s, n, ka, bb);
                    frag_b_nk(bb, dos, n * 8, kk * 16, lane);
                    mma2(dp, n, va, bb);
                }
            }
            // A stage with a query before one of the warp's keys, or a query or key past t, is
            // masked.
            if (q0 < kw + 15 || q0 + BQ_DKV > t || kw + 16 > t) mask<BQ_DKV / 8>(s, kw, q0, t, lane, true);
#pragma unroll
            for (int n = 0; n < BQ_DKV / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qi = n * 8 + c2 + (e & 1);
                    // exp2(-inf) = 0 for the masked scores.
                    float p = ex2(fmaf(s[n][e], sl2, -ls[qi] * LOG2E));
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - dl[qi]) * scale;
                }
            }
#pragma unroll
            for (int kk = 0; kk < BQ_DKV / 16; kk++) {
                u32 pa[4], da[4];
                acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
                acc_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
                for (int n = 0; n < DP / 8; n += 2) {
                    u32 bb[4];
                    frag_b_kn(bb, dos, kk * 16, n * 8, lane);
                    mma2(dv, n, pa, bb);
                    frag_b_kn(bb, qs, kk * 16, n * 8, lane);
                    mma2(dk, n, da, bb);
                }
            }
        }
        __syncthreads();
    }
    store_rows(dqkv + qoff + (long)h * d, dqkv_h + qoff + (long)h * d, ld3, dk, kw, t, lane, 1.f, 1.f);
    store_rows(dqkv + qoff + 2L * h * d, dqkv_h + qoff + 2L * h * d, ld3, dv, kw, t, lane, 1.f, 1.f);
}
