// How far a TCP peer has read: bytes it acknowledged and bytes still queued for it (Linux
// TCP_INFO and SIOCOUTQ). A response whose acknowledged count stops moving while bytes wait is
// stuck at the client, however much the kernel's (autotuned, up to megabytes) buffer still holds.
#pragma once

#include <cstdint>

namespace smolrt::server {

struct TcpProgress {
  uint64_t acked = 0;  // bytes the peer acknowledged over the connection's life
  int queued = 0;      // bytes written and not yet acknowledged (sent or not)
};

// Zeros when the descriptor is not a TCP socket.
TcpProgress tcp_progress(int fd);

}  // namespace smolrt::server
