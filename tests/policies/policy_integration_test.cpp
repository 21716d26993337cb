// Policies through a real gateway and simulated engines (filled in next).
#include <gtest/gtest.h>
