/* real_decl.h — declares a real-typed API for both precisions: a header defines
 *   #define K3C_FOO_API(real, S) int k3c_foo_fwd_##S(const real *x, ...);
 * and then writes K3C_DECLARE_REAL(K3C_FOO_API); the .c file (which includes real.h) defines k3c_foo_fwd. */
#ifndef K3C_REAL_DECL_H
#define K3C_REAL_DECL_H
#define K3C_DECLARE_REAL(API) API(float, f32) API(double, f64)
#endif
