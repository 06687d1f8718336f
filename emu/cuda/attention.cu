// The CUDA attention kernels (emu/ops.h's semantics, emu/cpu/attention_kernels.cpp's numerics): causal,
// grouped-query, fp32, classic and flash-style, forward and backward.
//
// Written plainly, not fast: one block per query row for the forward pass and for dq, one block per key row for dk
// and dv (looping over the query rows and the query heads of its kv group), so every gradient element has one
// writer. A block keeps its score row (or columns) in dynamic shared memory, which bounds seq by the GPU's
// per-block shared memory (checked at launch, naming the limit).
#include "emu/cuda/attention.cuh"

#include <climits>
#include <cmath>
#include <string>

#include "emu/cuda/check.h"
#include "emu/cuda/launch.cuh"

namespace emu::cuda {
namespace {

// Where rows live: q and dq rows at q_stride, k, v, dk, dv at kv_stride, out and dout at a·d (T = b·s rows).
struct AttentionGeometry {
  int64_t seq, heads, kv_heads, head_dim, group;  // group = a / kv query heads per kv head
  int64_t q_stride, kv_stride, out_stride;
  float scale;  // 1/√d

  // Element offsets of head h's (or kv head g's) block in token row b·s + i.
  __device__ int64_t q_at(int64_t b, int64_t h, int64_t i) const { return (b * seq + i) * q_stride + h * head_dim; }
  __device__ int64_t kv_at(int64_t b, int64_t g, int64_t j) const { return (b * seq + j) * kv_stride + g * head_dim; }
  __device__ int64_t out_at(int64_t b, int64_t h, int64_t i) const { return (b * seq + i) * out_stride + h * head_dim; }
  // Index of row i of head h in the [b, a, s] arrays (lse, D); times s, the start of its row in [b, a, s, s].
  __device__ int64_t row_at(int64_t b, int64_t h, int64_t i) const { return (b * heads + h) * seq + i; }
};

AttentionGeometry geometry(const AttentionShape& shape) {
  AttentionGeometry g;
  g.seq = shape.seq;
  g.heads = shape.heads;
  g.kv_heads = shape.kv_heads;
  g.head_dim = shape.head_dim;
  g.group = shape.heads / shape.kv_heads;
  g.out_stride = shape.heads * shape.head_dim;
  g.q_stride = shape.q_stride != 0 ? shape.q_stride : g.out_stride;
  g.kv_stride = shape.kv_stride != 0 ? shape.kv_stride : shape.kv_heads * shape.head_dim;
  g.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  return g;
}

__device__ inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += a[e] * b[e];
  return sum;
}

// One block per query row, blockIdx.x = row_at(b, h, i); row [s] (dynamic shared) holds its scores, then P.
// Writes out's row; probs' full row (zeros above the diagonal) when not null; lse[row] when not null.
__global__ void k_attention_forward(AttentionGeometry g, const float* q, const float* k, const float* v, float* probs,
                                    float* out, float* lse) {
  extern __shared__ float row[];
  const int64_t r = blockIdx.x, i = r % g.seq, h = (r / g.seq) % g.heads, b = r / (g.seq * g.heads);
  const int64_t kvh = h / g.group;
  const float* qi = q + g.q_at(b, h, i);
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    row[j] = g.scale * dot(qi, k + g.kv_at(b, kvh, j), g.head_dim);
    local_max = fmaxf(local_max, row[j]);
  }
  const float max = block_max(local_max);
  double local_sum = 0;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    row[j] = expf(row[j] - max);
    local_sum += row[j];
  }
  const float sum = static_cast<float>(block_sum(local_sum));
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) row[j] *= inv;  // each thread its own j, as above
  if (probs != nullptr) {
    float* p = probs + r * g.seq;
    for (int64_t j = threadIdx.x; j < g.seq; j += blockDim.x) p[j] = j <= i ? row[j] : 0.0f;
  }
  if (lse != nullptr && threadIdx.x == 0) lse[r] = max + logf(sum);
  __syncthreads();  // the whole row of P before out reads it
  float* o = out + g.out_at(b, h, i);
  for (int64_t e = threadIdx.x; e < g.head_dim; e += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += row[j] * v[g.kv_at(b, kvh, j) + e];
    o[e] = acc;
  }
}

// D [b, a, s]: dot(dout_i, out_i) per query row, accumulated in double; one thread per row.
__global__ void k_attention_row_dot(AttentionGeometry g, const float* out, const float* dout, float* d_rows,
                                    size_t rows) {
  EMU_FOR_EACH(r, rows) {
    const int64_t i = int64_t(r) % g.seq, h = (int64_t(r) / g.seq) % g.heads, b = int64_t(r) / (g.seq * g.heads);
    const int64_t at = g.out_at(b, h, i);
    double sum = 0;
    for (int64_t e = 0; e < g.head_dim; ++e) sum += double(out[at + e]) * dout[at + e];
    d_rows[r] = static_cast<float>(sum);
  }
}

// P_ij of query row i (r = row_at(b, h, i)) and key row j: the stored probs (classic) or exp(score − lse) (flash).
__device__ inline float attention_p(const AttentionGeometry& g, const float* q, const float* k, const float* probs,
                                    const float* lse, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t r = g.row_at(b, h, i);
  if (probs != nullptr) return probs[r * g.seq + j];
  return expf(g.scale * dot(q + g.q_at(b, h, i), k + g.kv_at(b, h / g.group, j), g.head_dim) - lse[r]);
}

// dS_ij = P_ij · (dout_i · v_j − D_i).
__device__ inline float attention_ds(const AttentionGeometry& g, const float* v, const float* dout, const float* d_rows,
                                     float p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const float dp = dot(dout + g.out_at(b, h, i), v + g.kv_at(b, h / g.group, j), g.head_dim);
  return p * (dp - d_rows[g.row_at(b, h, i)]);
}

// One block per query row, blockIdx.x = row_at(b, h, i); ds [s] (dynamic shared) holds the row of dS.
// dq_i = dS_i · k / √d overwritten; dscores' full row (zeros above the diagonal) written when not null.
__global__ void k_attention_backward_dq(AttentionGeometry g, const float* q, const float* k, const float* v,
                                        const float* probs, const float* lse, const float* dout, const float* d_rows,
                                        float* dq, float* dscores) {
  extern __shared__ float ds[];
  const int64_t r = blockIdx.x, i = r % g.seq, h = (r / g.seq) % g.heads, b = r / (g.seq * g.heads);
  const int64_t kvh = h / g.group;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    ds[j] = attention_ds(g, v, dout, d_rows, attention_p(g, q, k, probs, lse, b, h, i, j), b, h, i, j);
  }
  if (dscores != nullptr) {
    float* row = dscores + r * g.seq;
    for (int64_t j = threadIdx.x; j < g.seq; j += blockDim.x) row[j] = j <= i ? ds[j] : 0.0f;
  }
  __syncthreads();
  float* out = dq + g.q_at(b, h, i);
  for (int64_t e = threadIdx.x; e < g.head_dim; e += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j <= i; ++j) acc += ds[j] * k[g.kv_at(b, kvh, j) + e];
    out[e] = g.scale * acc;
  }
}

// One block per key row, blockIdx.x = (b·kv + g)·s + j; column [2, s − j] (dynamic shared) holds P_ij and dS_ij
// for i ≥ j of one query head at a time. Over the group's query heads in order: dk_j = Σ dSᵀ·q / √d and
// dv_j = Σ Pᵀ·dout, overwritten by the first head, added to by the rest (the CPU's order).
__global__ void k_attention_backward_dkdv(AttentionGeometry g, const float* q, const float* k, const float* v,
                                          const float* probs, const float* dscores, const float* lse, const float* dout,
                                          const float* d_rows, float* dk, float* dv) {
  extern __shared__ float column[];
  const int64_t r = blockIdx.x, j = r % g.seq, kvh = (r / g.seq) % g.kv_heads, b = r / (g.seq * g.kv_heads);
  const int64_t n = g.seq - j;  // query rows i = j .. s − 1
  float* p_col = column;
  float* ds_col = column + n;
  const int64_t at = g.kv_at(b, kvh, j);
  for (int64_t member = 0; member < g.group; ++member) {
    const int64_t h = kvh * g.group + member;
    for (int64_t i = j + threadIdx.x; i < g.seq; i += blockDim.x) {
      const float p = attention_p(g, q, k, probs, lse, b, h, i, j);
      p_col[i - j] = p;
      ds_col[i - j] =
          dscores != nullptr ? dscores[g.row_at(b, h, i) * g.seq + j] : attention_ds(g, v, dout, d_rows, p, b, h, i, j);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < g.head_dim; e += blockDim.x) {
      float sk = 0, sv = 0;
      for (int64_t i = j; i < g.seq; ++i) {
        sk += ds_col[i - j] * q[g.q_at(b, h, i) + e];
        sv += p_col[i - j] * dout[g.out_at(b, h, i) + e];
      }
      dk[at + e] = member == 0 ? g.scale * sk : dk[at + e] + g.scale * sk;
      dv[at + e] = member == 0 ? sv : dv[at + e] + sv;
    }
    __syncthreads();  // the columns are rewritten for the next head
  }
}

// Checks the shape and returns the number of query-row blocks, b·a·s (0: nothing to do).
unsigned attention_blocks(const AttentionShape& shape, const char* op) {
  if (shape.batch == 0 || shape.seq == 0 || shape.heads == 0) return 0;
  EMU_CUDA_REQUIRE(shape.batch > 0 && shape.seq > 0 && shape.heads > 0 && shape.head_dim > 0 && shape.kv_heads > 0 &&
                       shape.heads % shape.kv_heads == 0,
                   std::string(op) + ": bad shape (batch " + std::to_string(shape.batch) + ", seq " +
                       std::to_string(shape.seq) + ", heads " + std::to_string(shape.heads) + ", kv_heads " +
                       std::to_string(shape.kv_heads) + ", head_dim " + std::to_string(shape.head_dim) +
                       "): all must be positive and heads a multiple of kv_heads");
  const int64_t blocks = shape.batch * shape.heads * shape.seq;
  EMU_CUDA_REQUIRE(blocks <= INT_MAX, std::string(op) + ": batch·heads·seq = " + std::to_string(blocks) +
                                          " blocks passes the grid limit " + std::to_string(INT_MAX));
  return static_cast<unsigned>(blocks);
}

// Lets `kernel` take `floats_per_seq`·seq floats of dynamic shared memory, past the 48 KiB default up to what
// the GPU allows a block (less the kernel's static shared memory); a longer sequence ends the job naming it.
template <typename... Params>
void allow_shared(void (*kernel)(Params...), size_t bytes, int64_t seq, int floats_per_seq, const char* op,
                  size_t shared_per_block) {
  cudaFuncAttributes attributes{};
  EMU_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const size_t limit = shared_per_block - attributes.sharedSizeBytes;
  EMU_CUDA_REQUIRE(
      bytes <= limit,
      std::string(op) + ": seq = " + std::to_string(seq) + " needs " + std::to_string(bytes) +
          " bytes of shared memory per block (" + std::to_string(floats_per_seq) +
          " fp32 per position), over this GPU's limit of " + std::to_string(limit) +
          " bytes: the CUDA attention kernels take seq <= " + std::to_string(limit / (sizeof(float) * floats_per_seq)));
  EMU_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* probs,
                       float* out, float* lse, size_t shared_per_block) {
  const unsigned blocks = attention_blocks(shape, "attention_forward");
  if (blocks == 0) return;
  const size_t shared = sizeof(float) * size_t(shape.seq);
  allow_shared(k_attention_forward, shared, shape.seq, 1, "attention_forward", shared_per_block);
  k_attention_forward<<<blocks, kThreads, shared>>>(geometry(shape), q, k, v, probs, out, lse);
  EMU_CUDA_CHECK_LAUNCH();
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v, const float* probs,
                        const float* lse, const float* out, const float* dout, float* dq, float* dk, float* dv,
                        float* dscores, size_t shared_per_block, Ops& scratch) {
  const unsigned blocks = attention_blocks(shape, "attention_backward");
  if (blocks == 0) return;
  const AttentionGeometry g = geometry(shape);
  const size_t shared = sizeof(float) * size_t(shape.seq);
  allow_shared(k_attention_backward_dq, shared, shape.seq, 1, "attention_backward", shared_per_block);
  allow_shared(k_attention_backward_dkdv, 2 * shared, shape.seq, 2, "attention_backward", shared_per_block);
  auto* d_rows = static_cast<float*>(scratch.scratch_allocate(sizeof(float) * blocks, false));  // D [b, a, s]
  launch(k_attention_row_dot, blocks, g, out, dout, d_rows, size_t(blocks));
  k_attention_backward_dq<<<blocks, kThreads, shared>>>(g, q, k, v, probs, lse, dout, d_rows, dq, dscores);
  EMU_CUDA_CHECK_LAUNCH();
  const unsigned kv_blocks = static_cast<unsigned>(shape.batch * shape.kv_heads * shape.seq);
  k_attention_backward_dkdv<<<kv_blocks, kThreads, 2 * shared>>>(g, q, k, v, probs, dscores, lse, dout, d_rows, dk, dv);
  EMU_CUDA_CHECK_LAUNCH();
  scratch.scratch_free(d_rows, sizeof(float) * blocks);
}

}  // namespace emu::cuda
