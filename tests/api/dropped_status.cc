// Must NOT compile with -Werror=unused-result: a dropped Status (nodiscard_test).
#include "ula/address_space.h"

void Drop(ula::AddressSpace& space) { space.AddRequest(ula::RequestId(1), ula::Rank(0)); }
