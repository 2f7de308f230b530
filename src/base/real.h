/* real.h — the `real` type of the CPU reference: files that include this are compiled twice, as float (K3C_REAL_DOUBLE=0,
 * symbols suffixed _f32) and as double (=1, suffix _f64), so tests can run ops, layers and whole models in float64.
 * Definitions use the real name (k3c_rmsnorm_fwd); base/real_names.h maps it to the suffixed symbol. */
#ifndef K3C_REAL_H
#define K3C_REAL_H

#ifndef K3C_REAL_DOUBLE
#error "real.h: compile with -DK3C_REAL_DOUBLE=0 or 1 (the Makefile does this for every file that includes real.h)"
#endif

#include <cblas.h>
#include <math.h>

#include "base/real_names.h"

#if K3C_REAL_DOUBLE
typedef double real;
#define REAL_DTYPE K3C_F64
#define cblas_rgemm cblas_dgemm
#define cblas_raxpy cblas_daxpy
#define rexp exp
#define rlog log
#define rsqrt sqrt
#define rtanh tanh
#define rfabs fabs
#define rlog1p log1p
#define rerf erf
#define REAL_EPS 2.220446049250313e-16
#else
typedef float real;
#define REAL_DTYPE K3C_F32
#define cblas_rgemm cblas_sgemm
#define cblas_raxpy cblas_saxpy
#define rexp expf
#define rlog logf
#define rsqrt sqrtf
#define rtanh tanhf
#define rfabs fabsf
#define rlog1p log1pf
#define rerf erff
#define REAL_EPS 1.1920929e-07f
#endif

#endif
