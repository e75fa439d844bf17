/* Compile check of include/osprey.h as C (and C++ when built with c++):
 * prototypes and dlsym function-pointer types agree. Never linked to osprey. */
#include "osprey.h"
#include "osprey.h" /* include guard */

#ifdef __cplusplus
static_assert(OSPREY_TAG_SLOTS == 10, "tag slots");
#else
_Static_assert(OSPREY_TAG_SLOTS == 10, "tag slots");
#endif

static osprey_set_context_fn f1 = osprey_set_context;
static osprey_clear_context_fn f2 = osprey_clear_context;
static osprey_set_tag_fn f3 = osprey_set_tag;
static osprey_clear_tag_fn f4 = osprey_clear_tag;

int osprey_h_compiles(void) { return f1 != 0 && f2 != 0 && f3 != 0 && f4 != 0; }
