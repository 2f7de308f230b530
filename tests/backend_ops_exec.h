/* backend_ops_exec.h — the one precision-generic runner of tests/test_backend_ops.c: uploads a case's tensors into a
 * backend's memory, calls the op entries of its table (ops/backend.h), downloads the results. docs/CODE.md "Ops".
 *
 * Included once per table type with BO_REAL (float / double), BO_BE (k3c_backend_f32 / _f64) and BO_FN(name) (a
 * suffix) defined. Only the table's memory API touches backend memory (alloc / free / upload / download), never the
 * host, so the same code runs on the CPU tables and on the CUDA one. */

/* Host staging: the case's values (kept in double) as the table's element type. */
static void *BO_FN(stage)(const bo_tensor *t, const double *src, int poison) {
    size_t es = t->type == BO_T_I32   ? 4
                : t->type == BO_T_U8  ? 1
                : t->type == BO_T_F32 ? 4
                : t->type == BO_T_I64 ? 8
                                      : sizeof(BO_REAL);
    unsigned char *p = malloc(t->n * es + 1);
    if (!p) return NULL;
    for (size_t i = 0; i < t->n; i++) {
        double v = src ? src[i] : 0;
        switch (t->type) {
        case BO_T_REAL: ((BO_REAL *)p)[i] = poison ? (BO_REAL)NAN : (BO_REAL)v; break;
        case BO_T_F32: ((float *)p)[i] = poison ? NAN : (float)v; break;
        case BO_T_I32: ((int32_t *)p)[i] = poison ? -1 : (int32_t)v; break;
        case BO_T_U8: p[i] = (unsigned char)v; break;
        case BO_T_I64: ((int64_t *)p)[i] = poison ? -1 : (int64_t)v; break;
        }
    }
    return p;
}

static void BO_FN(unstage)(const bo_tensor *t, const void *p, double *dst) {
    for (size_t i = 0; i < t->n; i++) switch (t->type) {
        case BO_T_REAL: dst[i] = ((const BO_REAL *)p)[i]; break;
        case BO_T_F32: dst[i] = ((const float *)p)[i]; break;
        case BO_T_I32: dst[i] = ((const int32_t *)p)[i]; break;
        case BO_T_U8: dst[i] = ((const unsigned char *)p)[i]; break;
        case BO_T_I64: dst[i] = (double)((const int64_t *)p)[i]; break;
        }
}

static size_t BO_FN(bytes)(const bo_tensor *t) {
    size_t es = t->type == BO_T_I32   ? 4
                : t->type == BO_T_U8  ? 1
                : t->type == BO_T_F32 ? 4
                : t->type == BO_T_I64 ? 8
                                      : sizeof(BO_REAL);
    return t->n * es;
}

#define R(i) ((BO_REAL *)d[i])
#define CR(i) ((const BO_REAL *)d[i])
#define I32(i) ((int32_t *)d[i])
#define GRID(i) ((const k3c_grid_thw *)d[i])
#define WS(bytes) (ws = be->alloc((bytes) ? (bytes) : 64))

/* One phase of a case on backend be: the op's forward (phase 0) or its backward (phase 1; the forward's outputs are
 * inputs then, holding the reference's values). d[i] is tensor i in backend memory (NULL when absent). */
static int BO_FN(call)(const BO_BE *be, const bo_case *c, bo_io *io, void **d, int phase, k3c_err *err) {
    void *ws = NULL, *saved = NULL, *scratch = NULL;
    int rc = K3C_OK;
    const int f = c->flags;
    switch (c->op) {
    case OP_ZERO: rc = be->zero(R(0), (int64_t)io->t[0].n, err); break;
    case OP_ADD: rc = be->add(c->a, f & F_ALIAS ? CR(1) : CR(0), R(1), err); break;
    case OP_COPY2D: rc = be->copy2d(c->a, c->b, CR(0), c->c, R(1), c->d, f & F_ACC ? 1 : 0, err); break;
    case OP_SIGMOID:
        if (phase == 0) {
            if (f & F_INPLACE) { /* y = σ(y) with y holding x */
                rc = be->copy2d(1, c->a, CR(0), c->a, R(1), c->a, 0, err);
                if (!rc) rc = be->sigmoid(c->a, CR(1), R(1), err);
            } else
                rc = be->sigmoid(c->a, CR(0), R(1), err);
        } else
            rc = be->sigmoid_bwd(c->a, CR(1), CR(2), R(3), err);
        break;
    case OP_EMBEDDING: {
        k3c_embedding_sizes s = {c->a, c->b, c->c};
        rc = phase == 0 ? be->embedding_fwd(&s, I32(0), CR(1), R(2), err)
                        : be->embedding_bwd(&s, I32(0), CR(3), R(4), err);
        break;
    }
    case OP_RMSNORM: {
        k3c_rmsnorm_sizes s = {c->a, c->b, c->x};
        if (f & F_GATED)
            rc = phase == 0 ? be->gated_rmsnorm_fwd(&s, CR(0), CR(2), CR(1), R(3), R(4), err)
                            : be->gated_rmsnorm_bwd(&s, CR(0), CR(2), CR(1), CR(4), CR(5), R(6), R(8), R(7), err);
        else
            rc = phase == 0 ? be->rmsnorm_fwd(&s, CR(0), CR(1), R(3), R(4), err)
                            : be->rmsnorm_bwd(&s, CR(0), CR(1), CR(4), CR(5), R(6), R(7), err);
        break;
    }
    case OP_LINEAR: {
        k3c_linear_sizes s = {c->a, c->b, c->c, f & F_ACC ? 1 : 0};
        rc = phase == 0 ? be->linear_fwd(be->ctx, &s, CR(0), CR(1), R(2), err)
                        : be->linear_bwd(be->ctx, &s, CR(0), CR(1), CR(3), R(4), R(5), err);
        break;
    }
    case OP_SIGMOID_GATE:
        rc = phase == 0 ? be->sigmoid_gate_fwd(c->a, CR(0), CR(1), R(2), err)
                        : be->sigmoid_gate_bwd(c->a, CR(0), CR(1), CR(3), R(4), R(5), err);
        break;
    case OP_XENT: {
        k3c_xent_sizes s = {c->a, c->b, c->x, (const float *)d[5]};
        if (phase == 0)
            rc = be->xent_fwd(&s, CR(0), I32(1), (const uint8_t *)d[2], R(3), &io->loss, &io->count, err);
        else
            rc = be->xent_bwd(&s, CR(0), I32(1), (const uint8_t *)d[2], CR(3), c->y, R(4), err);
        break;
    }
    case OP_L2NORM: {
        k3c_l2norm_dims dd = {c->a, c->b, c->x};
        if (phase == 0) {
            if (f & F_INPLACE) { /* the model normalises q, k in place */
                rc = be->copy2d(1, c->a * c->b, CR(0), c->a * c->b, R(1), c->a * c->b, 0, err);
                if (!rc) rc = be->l2norm_fwd(&dd, CR(1), R(1), R(2), err);
            } else
                rc = be->l2norm_fwd(&dd, CR(0), R(1), R(2), err);
        } else
            rc = be->l2norm_bwd(&dd, CR(1), CR(2), CR(3), R(4), err);
        break;
    }
    case OP_SHORT_CONV: {
        k3c_short_conv_dims dd = {c->a, c->b, (int)c->c, c->ncu ? c->ncu - 1 : 0};
        if (phase == 0) {
            if (f & F_INPLACE) { /* state_out the same pointer as state_in (decode) */
                int64_t sn = (int64_t)io->t[3].n;
                rc = sn ? be->copy2d(1, sn, CR(3), sn, R(5), sn, 0, err) : K3C_OK;
                if (!rc) rc = be->short_conv_fwd(&dd, I32(0), CR(1), CR(2), CR(5), R(4), R(5), err);
            } else
                rc = be->short_conv_fwd(&dd, I32(0), CR(1), CR(2), CR(3), R(4), R(5), err);
        } else {
            WS(be->short_conv_bwd_workspace(&dd));
            rc = ws ? be->short_conv_bwd(&dd, I32(0), CR(1), CR(2), CR(3), CR(6), R(7), R(8), R(9), ws, err)
                    : K3C_ENOMEM;
        }
        break;
    }
    case OP_KDA_GATE: {
        k3c_kda_gate_dims dd = {c->a, c->b, c->c, (int)c->d, c->x};
        rc = phase == 0 ? be->kda_gate_fwd(&dd, CR(0), CR(1), CR(2), R(3), err)
                        : be->kda_gate_bwd(&dd, CR(0), CR(1), CR(2), CR(4), R(5), R(6), R(7), err);
        break;
    }
    case OP_KDA: {
        k3c_kda_dims dd = {c->a, c->b, c->c, c->d, c->ncu ? c->ncu - 1 : 0, (int)c->e, 0, c->x};
        if (phase == 0) {
            WS(be->kda_fwd_workspace(&dd));
            rc = ws ? be->kda_fwd(&dd, I32(0), CR(1), CR(2), CR(3), CR(4), CR(5), CR(6), R(7), R(8), ws, err)
                    : K3C_ENOMEM;
        } else {
            WS(be->kda_bwd_workspace(&dd));
            rc = ws ? be->kda_bwd(&dd, I32(0), CR(1), CR(2), CR(3), CR(4), CR(5), CR(6), CR(9), CR(10), R(11), R(12),
                                  R(13), R(14), R(15), R(16), ws, err)
                    : K3C_ENOMEM;
        }
        break;
    }
    case OP_ATTENTION: {
        k3c_attention_sizes s = {c->a, c->b, c->c, c->d, c->ncu ? c->ncu - 1 : 0, 1.0 / sqrt((double)c->c), 0, 0, 0};
        if (phase == 0) {
            WS(be->attention_fwd_workspace(&s));
            rc = ws ? be->attention_fwd(&s, I32(0), CR(1), CR(2), CR(3), R(4), R(5), ws, err) : K3C_ENOMEM;
        } else {
            WS(be->attention_bwd_workspace(&s));
            rc = ws ? be->attention_bwd(&s, I32(0), CR(1), CR(2), CR(3), CR(4), CR(5), CR(6), R(7), R(8), R(9), ws, err)
                    : K3C_ENOMEM;
        }
        break;
    }
    case OP_MAX_LOGIT: {
        k3c_attention_sizes s = {c->a, c->b, c->c, c->c, c->ncu ? c->ncu - 1 : 0, 1.0 / sqrt((double)c->c), 0, 0, 0};
        s.q_begin = c->d; /* query rows before it are context parallelism's padding */
        rc = be->attention_max_logit(&s, I32(0), CR(1), CR(2), (float *)d[3], err);
        break;
    }
    case OP_ROUTER: {
        k3c_router_sizes s = {c->a, c->b, c->c, (int)c->d, c->x};
        rc = phase == 0 ? be->router_fwd(&s, CR(0), CR(1), I32(2), R(3), R(4), err)
                        : be->router_bwd(&s, CR(0), I32(2), CR(5), R(6), err);
        break;
    }
    case OP_AUX_LOSS: {
        k3c_router_sizes s = {c->a, c->b, c->c, 0, 1.0};
        WS(be->aux_loss_workspace(&s));
        rc = ws ? be->aux_loss_bwd(&s, CR(0), I32(1), c->x, c->d, c->e, R(2), ws, err)
                : k3c_errf(err, K3C_ENOMEM, "harness: workspace");
        break;
    }
    case OP_MOE:
    case OP_MLP: {
        /* The saved buffer has each backend's own layout, so the backward runs the backend's own forward first. */
        const double b1 = f & F_WIDE ? 4.0 : 2.0, b2 = f & F_WIDE ? 25.0 : 3.0; /* SiTU's caps; F_WIDE: K3's */
        k3c_glu_act act = {f & F_SITU   ? K3C_ACT_SITU
                           : f & F_GELU ? K3C_ACT_GELU
                                        : K3C_ACT_SILU,
                           f & F_SITU ? b1 : 0, f & F_SITU ? b2 : 0};
        k3c_moe_sizes ms = {c->a, c->b, c->c, c->d, c->e, act};
        k3c_mlp_sizes ls = {c->a, c->b, c->c, act};
        int moe = c->op == OP_MOE;
        saved = be->alloc(moe ? be->moe_saved_bytes(&ms) : be->mlp_saved_bytes(&ls));
        WS(moe ? be->moe_workspace(&ms) : be->mlp_workspace(&ls));
        scratch = be->alloc(bytes_real(io->t[moe ? 5 : 4].n, sizeof(BO_REAL)));
        if (!saved || !ws || !scratch) {
            rc = k3c_errf(err, K3C_ENOMEM, "harness: workspace");
            break;
        }
        BO_REAL *y = phase == 0 ? R(moe ? 5 : 4) : (BO_REAL *)scratch;
        if (moe) {
            rc = be->moe_fwd(be->ctx, &ms, CR(0), I32(1), CR(2), CR(3), CR(4), CR(6), y, saved, ws, err);
            if (!rc && phase == 1)
                rc = be->moe_bwd(be->ctx, &ms, CR(0), I32(1), CR(2), CR(3), CR(4), CR(6), f & F_NOSAVED ? NULL : saved,
                                 CR(7), R(8), R(9), R(10), R(11), R(12), ws, err);
        } else {
            rc = be->mlp_fwd(be->ctx, &ls, CR(0), CR(1), CR(2), CR(3), y, saved, ws, err);
            if (!rc && phase == 1)
                rc = be->mlp_bwd(be->ctx, &ls, CR(0), CR(1), CR(2), CR(3), saved, CR(5), R(6), R(7), R(8), R(9), ws,
                                 err);
        }
        break;
    }
    case OP_MOE_PERM: {
        const int64_t T = c->a, k = c->b, D = c->c, rows = (int64_t)(io->t[4].n / (size_t)D);
        const int32_t *pos = I32(0), *perm = I32(1);
        if (phase == 0) {
            rc = be->moe_gather(rows, k, D, perm, CR(2), R(4), err);
            if (!rc) rc = be->moe_combine(T, k, D, pos, CR(3), CR(6), R(5), err);
        } else {
            rc = be->moe_gather_bwd(T, k, D, pos, CR(8), R(9), err);
            if (!rc) rc = be->moe_combine_bwd(T, k, D, pos, CR(3), CR(6), CR(7), R(10), R(11), err);
        }
        break;
    }
    case OP_BF16:
        scratch = be->alloc(bytes_real((size_t)c->a, sizeof(uint16_t)));
        rc = scratch ? be->to_bf16(c->a, CR(0), (uint16_t *)scratch, err)
                     : k3c_errf(err, K3C_ENOMEM, "harness: bf16 scratch");
        if (!rc) rc = be->from_bf16(c->a, (const uint16_t *)scratch, R(1), err);
        break;
    case OP_GELU:
        if (phase == 0)
            rc = (f & F_ERF ? be->gelu_erf : be->gelu_tanh)(c->a, CR(0), R(1), err);
        else
            rc = (f & F_ERF ? be->gelu_erf_bwd : be->gelu_tanh_bwd)(c->a, CR(0), CR(2), R(3), err);
        break;
    case OP_ROPE2D:
        rc = phase == 0 ? be->rope2d_fwd(bo_grid_L(c), c->a, c->b, CR(0), CR(1), R(2), err)
                        : be->rope2d_bwd(bo_grid_L(c), c->a, c->b, CR(0), CR(3), R(4), err);
        break;
    case OP_POSEMB: {
        const k3c_posemb_sizes s = {6, 5, 4, c->a, f & F_BICUBIC ? K3C_INTERP_BICUBIC : K3C_INTERP_BILINEAR};
        rc = phase == 0 ? be->posemb_fwd(&s, GRID(0), c->ng, bo_grid_L(c), CR(1), R(2), err)
                        : be->posemb_bwd(&s, GRID(0), c->ng, CR(3), R(4), err);
        break;
    }
    case OP_VIT_ATTN: {
        const k3c_vit_attn_sizes s = {bo_grid_L(c), c->a, c->b, 1.0 / sqrt((double)c->b)};
        rc = phase == 0 ? be->vit_attention_fwd(&s, I32(0), c->ng, CR(1), CR(2), CR(3), R(4), R(5), err)
                        : be->vit_attention_bwd(&s, I32(0), c->ng, CR(1), CR(2), CR(3), CR(4), CR(5), CR(6), R(7),
                                                R(8), R(9), err);
        break;
    }
    case OP_TPOOL:
        rc = phase == 0 ? be->tpool_merge_fwd(GRID(0), c->ng, bo_grid_N(c), c->a, 2, 2, CR(1), R(2), err)
                        : be->tpool_merge_bwd(GRID(0), c->ng, bo_grid_L(c), c->a, 2, 2, CR(3), R(4), err);
        break;
    case OP_ATTNRES: {
        k3c_attnres_sizes s = {c->a, c->b, c->c, c->x};
        const BO_REAL *v[K3C_ATTNRES_MAX_SOURCES];
        BO_REAL *dv[K3C_ATTNRES_MAX_SOURCES];
        size_t td = (size_t)(c->a * c->b);
        for (int64_t i = 0; i < c->c && i < K3C_ATTNRES_MAX_SOURCES; i++) { /* more: an error row */
            v[i] = CR(0) + (size_t)i * td;
            int64_t slot = bo_attnres_dv_slot(c, i);
            dv[i] = R(7) && slot >= 0 ? R(7) + (size_t)slot * td : NULL;
        }
        if (phase == 0)
            rc = be->attnres_fwd(&s, v, CR(1), CR(2), R(3), R(4), err);
        else {
            WS(be->attnres_workspace(&s));
            rc = ws ? be->attnres_bwd(&s, v, CR(1), CR(2), f & F_NOSAVED ? NULL : CR(4), CR(5), f & F_NODV ? NULL : dv,
                                      R(6), R(8), ws, err)
                    : K3C_ENOMEM;
        }
        break;
    }
    }
    if (ws) be->free(ws);
    if (saved) be->free(saved);
    if (scratch) be->free(scratch);
    return rc;
}
#undef R
#undef CR
#undef I32
#undef GRID
#undef WS

/* Runs phase `phase` of case c on be: tensors written by an earlier phase go up with io's values (the reference's),
 * outputs of this phase NaN-poisoned, accumulated ones pre-filled; afterwards this phase's outputs come back into io.
 * Returns the op's status (io->rc, io->msg) or a harness failure. */
static int BO_FN(exec)(const BO_BE *be, const bo_case *c, bo_io *io, int phase) {
    void *d[BO_MAX_T] = {0};
    k3c_err err = {0};
    int rc = K3C_OK;
    for (int i = 0; i < io->n && !rc; i++) {
        bo_tensor *t = &io->t[i];
        if (t->absent) continue;
        d[i] = be->alloc(BO_FN(bytes)(t) ? BO_FN(bytes)(t) : 64);
        const double *src = t->phase < phase ? t->h : t->acc ? t->init : NULL;
        void *h = BO_FN(stage)(t, src, t->phase == phase && !t->acc);
        if (!d[i] || !h)
            rc = k3c_errf(&err, K3C_ENOMEM, "harness: %s", t->name);
        else
            rc = be->upload(d[i], h, BO_FN(bytes)(t), &err);
        free(h);
    }
    if (!rc) {
        rc = BO_FN(call)(be, c, io, d, phase, &err);
        int src = be->sync(rc ? NULL : &err);
        if (!rc) rc = src;
    }
    io->rc = rc;
    snprintf(io->msg, sizeof io->msg, "%s", err.msg);
    for (int i = 0; i < io->n && !rc; i++) {
        bo_tensor *t = &io->t[i];
        if (t->absent || t->phase != phase) continue;
        void *h = malloc(BO_FN(bytes)(t) + 1);
        if (!h) {
            io->rc = rc = K3C_ENOMEM;
            break;
        }
        int r2 = be->download(h, d[i], BO_FN(bytes)(t), &err);
        if (r2) io->rc = rc = r2;
        BO_FN(unstage)(t, h, t->h);
        free(h);
    }
    for (int i = 0; i < io->n; i++)
        if (d[i]) be->free(d[i]);
    return rc;
}
