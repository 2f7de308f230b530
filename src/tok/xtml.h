/* xtml.h — internal to the chat formats (xtml_*.c, k2_*.c and their callers): the chat prompts and parsers declared
 * in the public k3c/tok.h, with the JSON reader they walk. docs/FORMATS.md §9. */
#ifndef K3C_XTML_H
#define K3C_XTML_H

#include "k3c/tok.h"
#include "base/json.h"

#endif
