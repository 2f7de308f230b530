/* golden.h — internal to the golden checks (golden.c, golden_kda.c) declared in the public k3c/check.h: the model
 * and KDA types they use. Spec: shared/golden/README.md. */
#ifndef K3C_MODEL_GOLDEN_H
#define K3C_MODEL_GOLDEN_H

#include "k3c/check.h"
#include "model/model.h"
#include "ops/kda.h"

#endif
