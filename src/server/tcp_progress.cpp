// Only <linux/tcp.h> has tcpi_bytes_acked (glibc's struct tcp_info stops before it), and it
// clashes with <netinet/tcp.h>, which Asio includes: hence a file of its own.
#include "server/tcp_progress.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstddef>

namespace smolrt::server {

TcpProgress tcp_progress(int fd) {
  TcpProgress p;
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
      len >= offsetof(tcp_info, tcpi_bytes_acked) + sizeof info.tcpi_bytes_acked)
    p.acked = info.tcpi_bytes_acked;
  int queued = 0;
  if (ioctl(fd, SIOCOUTQ, &queued) == 0) p.queued = queued;
  return p;
}

}  // namespace smolrt::server
