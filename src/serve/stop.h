/* stop.h — internal to the text side of generation (stop.c and its callers): the stopper of the public k3c/serve.h, an
 * incremental detokeniser that ends generation on stop strings. */
#ifndef K3C_SERVE_STOP_H
#define K3C_SERVE_STOP_H

#include "base/json.h"
#include "k3c/serve.h"

#endif
