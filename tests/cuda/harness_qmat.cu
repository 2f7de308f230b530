/* harness_qmat.cu — checks the CUDA weight-view product (src/cuda/qmat.cu) against the CPU reference k3c_qmat_mul_ref
 * (libk3c.a) on fresh random weights (float32, bf16, MXFP4 with scales 118..135) and inputs, n = 1..17, with and
 * without accumulation, outputs poisoned with NaN. Needs a GPU; usage: harness_qmat [seed]. */
#include "cuda/cuda_ops.h"
#include "cuda/testing.cuh"

/* 1e-5 relative (fp32): both decode the same exact weights and sum the same products in float, in different orders. */
static const double TOL = 1e-5;

static void test_one(harness &h, k3c_rng *r, int type, int64_t R, int64_t C, int64_t n, int acc) {
    const char *names[3] = {"f32", "bf16", "mxfp4"};
    std::vector<uint8_t> w, s;
    const std::vector<float> g = randn(r, (size_t)(R * C));
    if (type == K3C_QMAT_F32) {
        w.resize((size_t)(R * C) * 4);
        memcpy(w.data(), g.data(), w.size());
    } else if (type == K3C_QMAT_BF16) {
        w.resize((size_t)(R * C) * 2);
        for (int64_t i = 0; i < R * C; i++) ((uint16_t *)w.data())[i] = k3c_f32_to_bf16(g[(size_t)i]);
    } else {
        w.resize((size_t)(R * C / 2));
        s.resize((size_t)(R * C / 32));
        for (auto &b : w) b = (uint8_t)(k3c_rng_u64(r) & 255u);
        for (auto &b : s) b = (uint8_t)(118 + k3c_rng_u64(r) % 18);
    }
    const std::vector<float> x = randn(r, (size_t)(n * C)), y0 = randn(r, (size_t)(n * R));
    std::vector<float> ref = y0;
    k3c_qmat hw = {type, R, C, w.data(), type == K3C_QMAT_MXFP4 ? s.data() : nullptr};
    k3c_qmat_mul_ref(&hw, x.data(), n, ref.data(), acc);
    dbuf dw(h, w.data(), w.size()), ds(h, s.empty() ? 1 : s.size()), dx(h, x.data(), x.size() * 4),
        dy(h, y0.size() * 4);
    if (!s.empty()) h.ok(k3c_cuda_h2d(ds.p, s.data(), s.size(), &h.err), "h2d scales");
    if (acc)
        h.ok(k3c_cuda_h2d(dy.p, y0.data(), y0.size() * 4, &h.err), "h2d y");
    else
        dy.poison(h);
    k3c_qmat dwv = {type, R, C, dw.p, type == K3C_QMAT_MXFP4 ? ds.as<uint8_t>() : nullptr};
    h.ok(k3c_qmat_mul_cuda(&dwv, dx.as<float>(), n, dy.as<float>(), acc, &h.err), "qmat_mul_cuda");
    h.ok(k3c_cuda_sync(&h.err), "sync");
    const std::vector<float> got = download<float>(h, dy);
    h.compare("qmat_mul", fmt("%s R%lld C%lld n%lld", names[type], (long long)R, (long long)C, (long long)n),
              acc ? "acc" : "y", got.data(), ref.data(), got.size(), TOL, acc ? y0.data() : nullptr);
}

int main(int argc, char **argv) {
    harness h;
    k3c_cuda_ctx ctx;
    k3c_rng r = harness_start(h, ctx, argc, argv);
    const int64_t shapes[][2] = {{1, 32}, {37, 96}, {129, 1056}, {512, 512}, {1024, 1024}, {3, 7168}};
    for (int type = K3C_QMAT_F32; type <= K3C_QMAT_MXFP4; type++)
        for (auto &sh : shapes)
            for (int64_t n : {1, 2, 8, 9, 17})
                for (int acc = 0; acc < 2; acc++) test_one(h, &r, type, sh[0], sh[1], n, acc);
    for (int64_t C : {1, 13, 301}) /* widths that are no multiple of 32: float32 and bf16 only */
        for (int type = K3C_QMAT_F32; type <= K3C_QMAT_BF16; type++) test_one(h, &r, type, 33, C, 3, 1);
    k3c_err err{};
    uint8_t one = 0;
    k3c_qmat bad = {K3C_QMAT_MXFP4, 2, 48, &one, &one};
    const float no = 0.f;
    h.check_le("qmat_mul", "mxfp4 C48", "refuse",
               k3c_qmat_mul_cuda(&bad, &no, 1, nullptr, 0, &err) == K3C_EINVAL ? 0 : 1, 0);
    k3c_cuda_destroy(&ctx);
    return h.summary();
}
