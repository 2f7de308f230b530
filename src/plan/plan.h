/* plan.h — internal to `k3c plan` (src/plan/), a library without printing whose API is the public k3c/plan.h.
 * docs/PLAN.md. */
#ifndef K3C_PLAN_PLAN_H
#define K3C_PLAN_PLAN_H

#include "base/base.h"
#include "k3c/plan.h"

#endif
