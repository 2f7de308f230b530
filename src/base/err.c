/* err.c — error values with messages (docs/CODE.md "Errors"): set by the library, printed only by cli/. */
#include "base/base.h"

#include <stdarg.h>
#include <string.h>

int k3c_errf(k3c_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int k3c_err_wrap(k3c_err *err, const char *fmt, ...) {
    if (!err) return K3C_EINVAL;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t np = strlen(prefix);
    if (np > sizeof err->msg - 3) np = sizeof err->msg - 3;
    memcpy(err->msg, prefix, np);
    memcpy(err->msg + np, ": ", 2);
    size_t room = sizeof err->msg - np - 3, no = strnlen(old, sizeof old);
    if (no > room) no = room;
    memcpy(err->msg + np + 2, old, no);
    err->msg[np + 2 + no] = 0;
    return err->code ? err->code : K3C_EINVAL;
}

const char *k3c_status_name(int code) {
    switch (code) {
    case K3C_OK: return "ok";
    case K3C_EINVAL: return "invalid argument";
    case K3C_EIO: return "i/o error";
    case K3C_ENOMEM: return "out of memory";
    case K3C_EFORMAT: return "malformed file";
    case K3C_ECONFIG: return "bad config";
    case K3C_ENOTFOUND: return "not found";
    case K3C_EUNSUPPORTED: return "unsupported";
    case K3C_ENUMERIC: return "numeric error";
    case K3C_EDEVICE: return "device error";
    default: return "unknown error";
    }
}
