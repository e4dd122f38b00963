// What hipRTC 5.x sees as <hip/hip_fp16.h>: its half types and math are built in, and the system's header would
// define them a second time (redefinition of '__half_raw').
#pragma once
