/* check.h — CHECK_RC: return a non-zero k3c error code to the caller (the k3c_err already says what went wrong). */
#ifndef K3C_BASE_CHECK_H
#define K3C_BASE_CHECK_H

#define CHECK_RC(expr)                                                                                                 \
    do {                                                                                                               \
        int rc_ = (expr);                                                                                              \
        if (rc_) return rc_;                                                                                           \
    } while (0)

#endif
