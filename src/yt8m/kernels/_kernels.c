/* Fused kernels of training on the CPU, each one pass where eager PyTorch takes several: the MoE mixture's forward
 * and backward and DbofModel's cluster pooling, called as the torch ops of ops.py. Each is kept because
 * bench/bench_train.py shows it pays (the figure is at the kernel; bench/README.md says how it was measured). An
 * optimizer step and the cross-entropy's sum written here were deleted: they gained 1-3% of the step.
 *
 * Hand-written because the step's element-wise passes, not its matmuls, kept training at 60-70% of the matmul
 * ceiling: the MoE mixture alone took about 100 ms of a 450 ms step in eager PyTorch, and torch.compile's CPU code
 * 60-75 ms. exp and log are inlined polynomials (errors below 2 ulp) so that the loops vectorize. With GCC on
 * x86-64 Linux each function is compiled for AVX-512, AVX2 and plain x86-64 and the CPU picks at load time; other
 * compilers and CPUs (clang, macOS, aarch64) build one portable version. Callers split the rows (or channels) over
 * threads: these functions release the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

/* Below this, P or Q may have lost terms to underflow: such classes are redone in log space (exact_class). */
#define TINY_SUM 1e-30f
#define MAX_MIXTURES 64

#if defined(_MSC_VER) && !defined(__clang__)
#define restrict __restrict /* MSVC's C compiler knows `restrict` only under /std:c11 */
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Type punning through a union (memcpy into a local kept the loops from vectorizing) */
typedef union {
    float value;
    int32_t bits;
} FloatBits;

static inline float bits_to_float(int32_t bits) { return (FloatBits){.bits = bits}.value; }

static inline int32_t float_to_bits(float value) { return (FloatBits){.value = value}.bits; }

/* max(a, b) that keeps a NaN in b, unlike a plain comparison; fmaxf would keep the loops from vectorizing */
static inline float max_keeping_nan(float a, float b) { return b <= a ? a : b; }

/* e^x for x <= 0 (every caller's case), flushing to 0 below -87.3; a NaN stays NaN */
static inline float exp_nonpositive(float x) {
    float clamped = x < -87.3f ? -87.3f : (x == x ? x : 0.0f);
    /* round to nearest by adding and taking away 1.5 * 2^23 (nearbyintf would keep the loop from vectorizing) */
    float n = (clamped * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = clamped - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666667e-1f + r * (4.16666667e-2f +
              r * (8.33333333e-3f + r * (1.38888889e-3f + r * 1.98412698e-4f))))));
    float result = p * bits_to_float((int32_t)((uint32_t)((int32_t)n + 127) << 23));
    return x < -87.3f ? 0.0f : (x == x ? result : x);
}

/* log(x) for finite normal positive x; a NaN stays NaN */
static inline float log_positive(float x) {
    int32_t bits = float_to_bits(x);
    /* the mantissa scaled into [sqrt(1/2), sqrt(2)); >> of a negative int is arithmetic in every C compiler */
    int32_t exponent = (bits - 0x3F3504F3) >> 23;
    float m = bits_to_float(bits - (int32_t)((uint32_t)exponent << 23));
    float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    float series = s * (2.0f + s2 * (0.666666667f + s2 * (0.4f + s2 * (0.285714286f + s2 * 0.222222222f))));
    return (float)exponent * 0.693147181f + series + (x - x); /* + NaN for a NaN x: a select would not vectorize */
}

/* sigmoid(x) and sigmoid(-x), from one exp */
static inline void sigmoid_pair(float x, float *positive, float *negative) {
    float t = exp_nonpositive(-fabsf(x)), d = 1.0f / (1.0f + t);
    *positive = x >= 0.0f ? d : t * d;
    *negative = x >= 0.0f ? t * d : d;
}

/* Per row of the MoE mixture, whose gate logits are M + 1 runs of C classes and expert logits M runs, run i at
 * g + i * stride (and e + i * stride): the largest gate logit `top`, the terms u_j = exp(g_j - top),
 * s_i = sigmoid(e_i) and r_i = sigmoid(-e_i) (kept for the backward, which would otherwise compute them again),
 * P = sum_i u_i s_i and Q = u_M + sum_i u_i r_i; each loop runs over the row's classes so that it vectorizes. */
VECTOR_CLONES
static int moe_sums(const float *restrict g, const float *restrict e, Py_ssize_t stride, float *restrict top,
                    float *restrict u, float *restrict s, float *restrict r, float *restrict P, float *restrict Q,
                    Py_ssize_t classes, int mixtures) {
    const float *dummy = g + mixtures * stride;
    float *dummy_u = u + mixtures * classes;
    for (Py_ssize_t c = 0; c < classes; c++) top[c] = dummy[c];
    for (int i = 0; i < mixtures; i++)
        for (Py_ssize_t c = 0; c < classes; c++) top[c] = max_keeping_nan(top[c], g[i * stride + c]);
    for (Py_ssize_t c = 0; c < classes; c++) {
        dummy_u[c] = exp_nonpositive(dummy[c] - top[c]);
        P[c] = 0.0f;
        Q[c] = dummy_u[c];
    }
    for (int i = 0; i < mixtures; i++) {
        const float *gi = g + i * stride, *ei = e + i * stride;
        float *ui = u + i * classes, *si = s + i * classes, *ri = r + i * classes;
        for (Py_ssize_t c = 0; c < classes; c++) {
            ui[c] = exp_nonpositive(gi[c] - top[c]);
            sigmoid_pair(ei[c], &si[c], &ri[c]);
            P[c] += ui[c] * si[c];
            Q[c] += ui[c] * ri[c];
        }
    }
    int tiny = 0;
    for (Py_ssize_t c = 0; c < classes; c++) {
        tiny |= (P[c] < TINY_SUM) | (Q[c] < TINY_SUM);
        P[c] = P[c] < FLT_MIN ? FLT_MIN : P[c];
        Q[c] = Q[c] < FLT_MIN ? FLT_MIN : Q[c];
    }
    return tiny;
}

/* Class c of a row in log space, in double precision, for the few where P or Q is below TINY_SUM (a term may
 * have underflowed): a_i = g_i + log sigmoid(e_i), b = (g_M, g_i + log sigmoid(-e_i)); the logit is
 * logsumexp(a) - logsumexp(b), and wa_i = exp(a_i - logsumexp(a)), wb_j = exp(b_j - logsumexp(b)) are
 * u_i s_i / P and u r / Q of the float path. */
static double exact_class(const float *g, const float *e, Py_ssize_t stride, int mixtures, Py_ssize_t c,
                          double *wa, double *wb) {
    double top_a = -HUGE_VAL, top_b = g[mixtures * stride + c], sum_a = 0.0, sum_b = 0.0;
    wb[0] = top_b;
    for (int i = 0; i < mixtures; i++) {
        double x = e[i * stride + c], softplus_x = (x > 0 ? x : 0.0) + log1p(exp(-fabs(x)));
        wa[i] = g[i * stride + c] + x - softplus_x;  /* g + log sigmoid(x) */
        wb[i + 1] = g[i * stride + c] - softplus_x;  /* g + log sigmoid(-x) */
        top_a = wa[i] > top_a ? wa[i] : top_a;
        top_b = wb[i + 1] > top_b ? wb[i + 1] : top_b;
    }
    for (int i = 0; i < mixtures; i++) sum_a += exp(wa[i] - top_a);
    for (int j = 0; j <= mixtures; j++) sum_b += exp(wb[j] - top_b);
    double lse_a = top_a + log(sum_a), lse_b = top_b + log(sum_b);
    for (int i = 0; i < mixtures; i++) wa[i] = exp(wa[i] - lse_a);
    for (int j = 0; j <= mixtures; j++) wb[j] = exp(wb[j] - lse_b);
    return lse_a - lse_b;
}

/* Kept: MoeModel's step takes 2.3-4.0% less time (wall and CPU medians of interleaved steps) with this kernel and
 * moe_backward_rows than with the eager mixture (bench_train.py --kernels all --kernels=-moe, AMD EPYC, 2 cores).
 *
 * Logits of the MoE mixture over rows [row_start, row_end) of `rows`: gate logits [M + 1, rows, C] and expert
 * logits [M, rows, C], each mixture's a run of C per row as MoeModel's run-major layers give them.
 * p = sum_i u_i s_i / sum_j u_j, and its logit log p - log(1 - p) = log P - log Q: both sums of positive terms, so
 * exact where p rounds to 0 or 1; a class where either falls below TINY_SUM (a term may have underflowed) is redone
 * in log space. `work` holds (3M + 4) * C floats. */
VECTOR_CLONES
static void moe_forward_rows(const float *gates, const float *experts, float *restrict logits,
                             float *restrict predictions, float *work, Py_ssize_t rows, Py_ssize_t classes,
                             int mixtures, Py_ssize_t row_start, Py_ssize_t row_end) {
    float *top = work, *P = work + classes, *Q = work + 2 * classes, *u = work + 3 * classes;
    float *s = u + (mixtures + 1) * classes, *r = s + mixtures * classes;
    Py_ssize_t stride = rows * classes;
    for (Py_ssize_t row = row_start; row < row_end; row++) {
        const float *g = gates + row * classes, *e = experts + row * classes;
        int tiny = moe_sums(g, e, stride, top, u, s, r, P, Q, classes, mixtures);
        float *z = logits + row * classes, *p = predictions + row * classes;
        for (Py_ssize_t c = 0; c < classes; c++) {
            z[c] = log_positive(P[c]) - log_positive(Q[c]);
            p[c] = P[c] / (P[c] + Q[c]);  /* P + Q is the sum of the gate terms, at least 1 */
        }
        double wa[MAX_MIXTURES], wb[MAX_MIXTURES + 1];
        for (Py_ssize_t c = 0; tiny && c < classes; c++)
            if (P[c] < TINY_SUM || Q[c] < TINY_SUM) {
                double logit = exact_class(g, e, stride, mixtures, c, wa, wb);
                z[c] = (float)logit;
                p[c] = (float)(1.0 / (1.0 + exp(-logit)));
            }
    }
}

/* One expert's and its gate's gradients over a row's classes, from its terms u, s, r (moe_sums), P = dz / P and
 * Q = dz / Q. */
VECTOR_CLONES
static void expert_gradients(const float *restrict u, const float *restrict s, const float *restrict r,
                             const float *restrict P, const float *restrict Q, float *restrict dg,
                             float *restrict de, Py_ssize_t classes) {
    for (Py_ssize_t c = 0; c < classes; c++) {
        dg[c] = u[c] * (s[c] * P[c] - r[c] * Q[c]);
        de[c] = u[c] * s[c] * r[c] * (P[c] + Q[c]);
    }
}

/* Class c's gradients in log space (see exact_class), written into the row's runs of dg and de. */
static void exact_gradients(const float *g, const float *e, float dz, float *dg, float *de, Py_ssize_t stride,
                            int mixtures, Py_ssize_t c) {
    double wa[MAX_MIXTURES], wb[MAX_MIXTURES + 1];
    exact_class(g, e, stride, mixtures, c, wa, wb);
    for (int i = 0; i < mixtures; i++) {
        double x = e[i * stride + c], s = 1.0 / (1.0 + exp(-x)), r = 1.0 / (1.0 + exp(x));
        dg[i * stride + c] = (float)(dz * (wa[i] - wb[i + 1]));
        de[i * stride + c] = (float)(dz * (wa[i] * r + wb[i + 1] * s));
    }
    dg[mixtures * stride + c] = (float)(-dz * wb[0]);
}

/* The mixture's gradients from dz = dL/dlogit, in the layout of its inputs: dg_i = dz u_i (s_i / P - r_i / Q),
 * dg_M = -dz u_M / Q and de_i = dz u_i s_i r_i (1 / P + 1 / Q), with r_i = sigmoid(-e_i). `work` holds (3M + 4) * C
 * floats and C int32. */
VECTOR_CLONES
static void moe_backward_rows(const float *gates, const float *experts, const float *dlogits, float *dgates,
                              float *dexperts, float *work, Py_ssize_t rows, Py_ssize_t classes, int mixtures,
                              Py_ssize_t row_start, Py_ssize_t row_end) {
    float *restrict top = work, *restrict P = work + classes, *restrict Q = work + 2 * classes;
    float *u = work + 3 * classes, *s = u + (mixtures + 1) * classes, *r = s + mixtures * classes;
    int32_t *tiny_classes = (int32_t *)(r + mixtures * classes);
    Py_ssize_t stride = rows * classes;
    for (Py_ssize_t row = row_start; row < row_end; row++) {
        const float *g = gates + row * classes, *e = experts + row * classes;
        float *dg = dgates + row * classes, *de = dexperts + row * classes;
        const float *restrict dz = dlogits + row * classes;
        Py_ssize_t tiny = 0;
        if (moe_sums(g, e, stride, top, u, s, r, P, Q, classes, mixtures))
            for (Py_ssize_t c = 0; c < classes; c++)
                if (P[c] < TINY_SUM || Q[c] < TINY_SUM) tiny_classes[tiny++] = (int32_t)c;
        for (Py_ssize_t c = 0; c < classes; c++) {  /* from here on P and Q hold dz / P and dz / Q */
            P[c] = dz[c] / P[c];
            Q[c] = dz[c] / Q[c];
        }
        float *restrict dummy_out = dg + mixtures * stride;
        const float *restrict dummy_u = u + mixtures * classes;
        for (Py_ssize_t c = 0; c < classes; c++) dummy_out[c] = -dummy_u[c] * Q[c];
        for (int i = 0; i < mixtures; i++)
            expert_gradients(u + i * classes, s + i * classes, r + i * classes, P, Q, dg + i * stride,
                             de + i * stride, classes);
        for (Py_ssize_t k = 0; k < tiny; k++)
            exact_gradients(g, e, dz[tiny_classes[k]], dg, de, stride, mixtures, tiny_classes[k]);
    }
}

/* Per channel of [c_start, c_start + width), the sums of x and x^2 over the rows, in double. */
VECTOR_CLONES
static void channel_moments(const float *restrict x, double *restrict sum, double *restrict squares,
                            Py_ssize_t rows, Py_ssize_t channels, Py_ssize_t c_start, Py_ssize_t width) {
    for (Py_ssize_t k = 0; k < width; k++) sum[k] = squares[k] = 0.0;
    for (Py_ssize_t n = 0; n < rows; n++) {
        const float *row = x + n * channels + c_start;
        for (Py_ssize_t k = 0; k < width; k++) {
            sum[k] += row[k];
            squares[k] += (double)row[k] * row[k];
        }
    }
}

/* relu6(xhat * gamma + beta) for xhat = (x - mean) * invstd; a NaN passes both tests and stays */
static inline float normalized_relu6(float x, float mean, float invstd, float gamma, float beta) {
    float y = (x - mean) * invstd * gamma + beta;
    return y < 0.0f ? 0.0f : (y > 6.0f ? 6.0f : y);
}

/* Frame t of a video against the best so far, per channel: the larger normalized ReLU6 wins (a NaN wins and
 * stays), and `from` records the frame it came from. */
VECTOR_CLONES
static void keep_larger(const float *restrict row, const float *restrict m, const float *restrict s,
                        const float *restrict g, const float *restrict b, float *restrict best,
                        int32_t *restrict from, int32_t t, Py_ssize_t width) {
    for (Py_ssize_t k = 0; k < width; k++) {
        float y = normalized_relu6(row[k], m[k], s[k], g[k], b[k]), current = best[k];
        int32_t keep = (y <= current) | (current != current); /* in this form the loop vectorizes */
        best[k] = keep ? current : y;
        from[k] = keep ? from[k] : t;
    }
}

/* Kept: DbofModel's step takes 3.2-5.5% less time (wall and CPU medians of interleaved steps) with this kernel and
 * dbof_pool_backward_channels than with eager PyTorch (bench_train.py --kernels all --kernels=-dbof, AMD EPYC,
 * 2 cores).
 *
 * DbofModel's cluster layer in training: batch norm over the rows of x [N, C] (N = videos x frames per video),
 * ReLU6, and max-pooling over each video's frames, without materializing any [N, C] activation.
 * Per channel c of [c_start, c_end): batch mean and biased variance (summed in double), y = relu6((x - mean) *
 * invstd * gamma + beta), and per video the largest y with the frame it came from (the first of ties; a NaN
 * wins and stays). Ties only happen where ReLU6 clamps, whose gradient is 0, so one winner per video loses
 * nothing against reduce_max's shared gradient. `work` holds 2 * (c_end - c_start) doubles. */
VECTOR_CLONES
static void dbof_pool_forward_channels(const float *restrict x, const float *restrict gamma,
                                       const float *restrict beta, float *restrict mean, float *restrict var,
                                       float *restrict invstd, float *restrict pooled, int32_t *restrict winner,
                                       double *work, Py_ssize_t rows, Py_ssize_t channels, int frames,
                                       float eps, Py_ssize_t c_start, Py_ssize_t c_end) {
    Py_ssize_t width = c_end - c_start;
    channel_moments(x, work, work + width, rows, channels, c_start, width);
    for (Py_ssize_t k = 0; k < width; k++) {
        double m = work[k] / rows, v = work[width + k] / rows - m * m;
        v = v > 0.0 ? v : 0.0;
        mean[c_start + k] = (float)m;
        var[c_start + k] = (float)v;
        invstd[c_start + k] = (float)(1.0 / sqrt(v + eps));
    }
    const float *m = mean + c_start, *s = invstd + c_start, *g = gamma + c_start, *b = beta + c_start;
    for (Py_ssize_t video = 0; video < rows / frames; video++) {
        float *best = pooled + video * channels + c_start;
        int32_t *from = winner + video * channels + c_start;
        const float *first = x + video * frames * channels + c_start;
        for (Py_ssize_t k = 0; k < width; k++) {
            best[k] = normalized_relu6(first[k], m[k], s[k], g[k], b[k]);
            from[k] = 0;
        }
        for (int t = 1; t < frames; t++) keep_larger(first + t * channels, m, s, g, b, best, from, t, width);
    }
}

/* The gradient of dbof_pool_forward: the pooled gradient reaches each video's winning frame where ReLU6 passes it
 * (0 < y < 6), then batch norm's backward spreads it over all rows: dx = gamma * invstd * (dy - sum(dy) / N -
 * xhat * sum(dy * xhat) / N), with dgamma = sum(dy * xhat) and dbeta = sum(dy) per channel. `work` holds
 * (videos + 2) * (c_end - c_start) floats. */
VECTOR_CLONES
static void dbof_pool_backward_channels(const float *restrict x, const float *restrict gamma,
                                        const float *restrict beta, const float *restrict mean,
                                        const float *restrict invstd, const float *restrict dpooled,
                                        const int32_t *restrict winner, float *restrict dx, float *restrict dgamma,
                                        float *restrict dbeta, float *restrict work, Py_ssize_t rows,
                                        Py_ssize_t channels, int frames, Py_ssize_t c_start, Py_ssize_t c_end) {
    Py_ssize_t width = c_end - c_start, videos = rows / frames;
    float *dy = work, *sum_dy = work + videos * width, *sum_dy_xhat = sum_dy + width;
    for (Py_ssize_t k = 0; k < width; k++) sum_dy[k] = sum_dy_xhat[k] = 0.0f;
    for (Py_ssize_t video = 0; video < videos; video++) {
        const float *grad = dpooled + video * channels + c_start;
        const int32_t *from = winner + video * channels + c_start;
        float *out = dy + video * width;
        for (Py_ssize_t k = 0; k < width; k++) {
            Py_ssize_t c = c_start + k;
            float xhat = (x[(video * frames + from[k]) * channels + c] - mean[c]) * invstd[c];
            float y = xhat * gamma[c] + beta[c];
            out[k] = ((y > 0.0f) & (y < 6.0f)) ? grad[k] : 0.0f;
            sum_dy[k] += out[k];
            sum_dy_xhat[k] += out[k] * xhat;
        }
    }
    for (Py_ssize_t k = 0; k < width; k++) {
        dgamma[c_start + k] = sum_dy_xhat[k];
        dbeta[c_start + k] = sum_dy[k];
        sum_dy[k] /= (float)rows;
        sum_dy_xhat[k] /= (float)rows;
    }
    for (Py_ssize_t n = 0; n < rows; n++) {
        Py_ssize_t video = n / frames;
        int t = (int)(n % frames);
        const float *row = x + n * channels + c_start;
        const int32_t *from = winner + video * channels + c_start;
        const float *grad = dy + video * width;
        float *out = dx + n * channels + c_start;
        for (Py_ssize_t k = 0; k < width; k++) {
            Py_ssize_t c = c_start + k;
            float xhat = (row[k] - mean[c]) * invstd[c];
            float own = from[k] == t ? grad[k] : 0.0f;
            out[k] = gamma[c] * invstd[c] * (own - sum_dy[k] - xhat * sum_dy_xhat[k]);
        }
    }
}

static void release_buffers(Py_buffer **views, int count) {
    for (int k = 0; k < count; k++) PyBuffer_Release(views[k]);
}

static int float_buffer(Py_buffer *view, Py_ssize_t count, const char *name) {
    if (view->len != count * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float32 values, got %zd bytes", name, count, view->len);
        return 0;
    }
    return 1;
}

/* The shapes every MoE call shares: counts in range, rows inside the buffers, gates and experts of `rows` rows. */
static int moe_shapes_fit(const char *name, Py_ssize_t classes, int mixtures, Py_ssize_t rows, Py_ssize_t row_start,
                          Py_ssize_t row_end, Py_buffer *gates, Py_buffer *experts) {
    if (mixtures < 1 || mixtures > MAX_MIXTURES || classes < 1 || classes > INT32_MAX || row_start < 0 ||
        row_end > rows || row_start > row_end) {
        PyErr_Format(PyExc_ValueError, "%s: mixtures, classes or rows out of range", name);
        return 0;
    }
    return float_buffer(gates, rows * (mixtures + 1) * classes, "gates") &&
           float_buffer(experts, rows * mixtures * classes, "experts");
}

PyDoc_STRVAR(moe_forward_doc,
"moe_forward(gates, experts, logits, predictions, classes, mixtures, row_start, row_end)\n\n"
"The MoE mixture's logits and probabilities of rows [row_start, row_end) into `logits` and `predictions`\n"
"[rows, classes] from gate logits [mixtures + 1, rows, classes] and expert logits [mixtures, rows, classes]\n"
"(float32 buffers).");

static PyObject *moe_forward(PyObject *self, PyObject *args) {
    Py_buffer gates, experts, logits, predictions;
    Py_ssize_t classes, row_start, row_end;
    int mixtures;
    if (!PyArg_ParseTuple(args, "y*y*w*w*ninn", &gates, &experts, &logits, &predictions, &classes, &mixtures,
                          &row_start, &row_end))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = classes > 0 ? logits.len / (Py_ssize_t)sizeof(float) / classes : 0;
    float *work = NULL;
    if (!moe_shapes_fit("moe_forward", classes, mixtures, rows, row_start, row_end, &gates, &experts) ||
        !float_buffer(&logits, rows * classes, "logits") || !float_buffer(&predictions, rows * classes, "predictions"))
        goto done;
    work = PyMem_RawMalloc((3 * (Py_ssize_t)mixtures + 4) * classes * sizeof(float));
    if (work == NULL && PyErr_NoMemory() == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS
    moe_forward_rows(gates.buf, experts.buf, logits.buf, predictions.buf, work, rows, classes, mixtures, row_start,
                     row_end);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(work);
    release_buffers((Py_buffer *[]){&gates, &experts, &logits, &predictions}, 4);
    return result;
}

PyDoc_STRVAR(moe_backward_doc,
"moe_backward(gates, experts, dlogits, dgates, dexperts, classes, mixtures, row_start, row_end)\n\n"
"The MoE mixture's gradients of rows [row_start, row_end) into `dgates` and `dexperts`, laid out as the gate\n"
"and expert logits.");

static PyObject *moe_backward(PyObject *self, PyObject *args) {
    Py_buffer gates, experts, dlogits, dgates, dexperts;
    Py_ssize_t classes, row_start, row_end;
    int mixtures;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*ninn", &gates, &experts, &dlogits, &dgates, &dexperts, &classes,
                          &mixtures, &row_start, &row_end))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = classes > 0 ? dlogits.len / (Py_ssize_t)sizeof(float) / classes : 0;
    float *work = NULL;
    if (!moe_shapes_fit("moe_backward", classes, mixtures, rows, row_start, row_end, &gates, &experts) ||
        !float_buffer(&dlogits, rows * classes, "dlogits") ||
        !float_buffer(&dgates, rows * (mixtures + 1) * classes, "dgates") ||
        !float_buffer(&dexperts, rows * mixtures * classes, "dexperts"))
        goto done;
    work = PyMem_RawMalloc((3 * (Py_ssize_t)mixtures + 5) * classes * sizeof(float));
    if (work == NULL && PyErr_NoMemory() == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS
    moe_backward_rows(gates.buf, experts.buf, dlogits.buf, dgates.buf, dexperts.buf, work, rows, classes, mixtures,
                      row_start, row_end);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(work);
    release_buffers((Py_buffer *[]){&gates, &experts, &dlogits, &dgates, &dexperts}, 5);
    return result;
}

/* The shapes both DBoF pooling calls share: x of `rows` x `channels` floats, rows a multiple of `frames`,
 * per-channel vectors of `channels` floats, [videos, channels] pooled arrays, the channel range within. */
static int dbof_shapes_fit(const char *name, Py_buffer *x, Py_ssize_t channels, int frames, Py_ssize_t c_start,
                           Py_ssize_t c_end, Py_buffer **vectors, int vector_count, Py_buffer **pooled,
                           int pooled_count, Py_ssize_t *rows) {
    *rows = channels > 0 ? x->len / (Py_ssize_t)sizeof(float) / channels : 0;
    if (channels < 1 || frames < 1 || *rows < frames || *rows % frames || c_start < 0 || c_end > channels ||
        c_start > c_end) {
        PyErr_Format(PyExc_ValueError, "%s: channels, frames or channel range out of range", name);
        return 0;
    }
    if (!float_buffer(x, *rows * channels, "x")) return 0;
    for (int k = 0; k < vector_count; k++)
        if (!float_buffer(vectors[k], channels, "per-channel vector")) return 0;
    for (int k = 0; k < pooled_count; k++)
        if (!float_buffer(pooled[k], *rows / frames * channels, "pooled array")) return 0;
    return 1;
}

PyDoc_STRVAR(dbof_pool_forward_doc,
"dbof_pool_forward(x, gamma, beta, mean, var, invstd, pooled, winner, channels, frames, eps, c_start, c_end)\n\n"
"Batch norm (batch statistics) of x [rows, channels], ReLU6, and the max over each video's `frames` rows, for\n"
"channels [c_start, c_end): writes the batch mean, biased variance and 1 / sqrt(var + eps), pooled [videos,\n"
"channels] and winner (int32, the frame each maximum came from).");

static PyObject *dbof_pool_forward(PyObject *self, PyObject *args) {
    Py_buffer x, gamma, beta, mean, var, invstd, pooled, winner;
    Py_ssize_t channels, c_start, c_end, rows;
    int frames;
    float eps;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*w*w*w*nifnn", &x, &gamma, &beta, &mean, &var, &invstd, &pooled, &winner,
                          &channels, &frames, &eps, &c_start, &c_end))
        return NULL;
    PyObject *result = NULL;
    double *work = NULL;
    if (!dbof_shapes_fit("dbof_pool_forward", &x, channels, frames, c_start, c_end,
                         (Py_buffer *[]){&gamma, &beta, &mean, &var, &invstd}, 5, (Py_buffer *[]){&pooled, &winner},
                         2, &rows))
        goto done;
    work = PyMem_RawMalloc((2 * (c_end - c_start) + 1) * sizeof(double));
    if (work == NULL && PyErr_NoMemory() == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS
    dbof_pool_forward_channels(x.buf, gamma.buf, beta.buf, mean.buf, var.buf, invstd.buf, pooled.buf, winner.buf,
                               work, rows, channels, frames, eps, c_start, c_end);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(work);
    release_buffers((Py_buffer *[]){&x, &gamma, &beta, &mean, &var, &invstd, &pooled, &winner}, 8);
    return result;
}

PyDoc_STRVAR(dbof_pool_backward_doc,
"dbof_pool_backward(x, gamma, beta, mean, invstd, dpooled, winner, dx, dgamma, dbeta, channels, frames,\n"
"                   c_start, c_end)\n\n"
"The gradients of dbof_pool_forward for channels [c_start, c_end): dx [rows, channels], dgamma and dbeta.");

static PyObject *dbof_pool_backward(PyObject *self, PyObject *args) {
    Py_buffer x, gamma, beta, mean, invstd, dpooled, winner, dx, dgamma, dbeta;
    Py_ssize_t channels, c_start, c_end, rows;
    int frames;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*w*w*w*ninn", &x, &gamma, &beta, &mean, &invstd, &dpooled, &winner,
                          &dx, &dgamma, &dbeta, &channels, &frames, &c_start, &c_end))
        return NULL;
    PyObject *result = NULL;
    float *work = NULL;
    if (!dbof_shapes_fit("dbof_pool_backward", &x, channels, frames, c_start, c_end,
                         (Py_buffer *[]){&gamma, &beta, &mean, &invstd, &dgamma, &dbeta}, 6,
                         (Py_buffer *[]){&dpooled, &winner}, 2, &rows) ||
        !float_buffer(&dx, rows * channels, "dx"))
        goto done;
    work = PyMem_RawMalloc((rows / frames + 2) * (c_end - c_start) * sizeof(float) + sizeof(float));
    if (work == NULL && PyErr_NoMemory() == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS
    dbof_pool_backward_channels(x.buf, gamma.buf, beta.buf, mean.buf, invstd.buf, dpooled.buf, winner.buf, dx.buf,
                                dgamma.buf, dbeta.buf, work, rows, channels, frames, c_start, c_end);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyMem_RawFree(work);
    release_buffers((Py_buffer *[]){&x, &gamma, &beta, &mean, &invstd, &dpooled, &winner, &dx, &dgamma, &dbeta}, 10);
    return result;
}

static PyMethodDef methods[] = {
    {"moe_forward", moe_forward, METH_VARARGS, moe_forward_doc},
    {"moe_backward", moe_backward, METH_VARARGS, moe_backward_doc},
    {"dbof_pool_forward", dbof_pool_forward, METH_VARARGS, dbof_pool_forward_doc},
    {"dbof_pool_backward", dbof_pool_backward, METH_VARARGS, dbof_pool_backward_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "yt8m._kernels", .m_size = -1,
                                    .m_methods = methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
