// Must compile with -Werror=unused-result: the same call, its Status checked (nodiscard_test).
#include "ula/address_space.h"

bool Keep(ula::AddressSpace& space) { return space.AddRequest(ula::RequestId(1), ula::Rank(0)).has_value(); }
