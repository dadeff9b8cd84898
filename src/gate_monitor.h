/* gate_monitor.h: the listening socket's monitor events, each accepted connection named at
 * once. ZeroMQ 4.3's monitor names the listener's own endpoint in every event, never the peer
 * (its version 2 events, which would, are a draft API Debian's libzmq is built without), and a
 * peer that sends a bad greeting and closes is gone microseconds after it was accepted. So a
 * thread of the gate's own reads the events as ZeroMQ sends them and reads the address of an
 * accepted descriptor before ZeroMQ can have closed it; the loop reads the events from it. */
#ifndef KVX_SRC_GATE_MONITOR_H
#define KVX_SRC_GATE_MONITOR_H

#include "kvx.h"

#include <stdbool.h>
#include <stdint.h>

#define GATE_ADDRESS_SIZE 64

struct gate_monitor;

/* One monitor event of the listener, as ZeroMQ sent it, and for ZMQ_EVENT_ACCEPTED what the
 * descriptor (`value`) held when the thread looked: its peer's IP address ("" when it was
 * closed already) and its socket cookie (SO_COOKIE, 0 then), which tells later whether the
 * descriptor still holds the same connection. */
struct gate_event {
    uint16_t event; /* ZMQ_EVENT_* */
    uint32_t value; /* the descriptor, or an error or status code */
    uint64_t cookie;
    char address[GATE_ADDRESS_SIZE];
};

/* Monitors `router` (call before it binds) from a thread of its own, in ZeroMQ context `zmq`:
 * accepted, handshake succeeded, handshake failed and disconnected events. */
kvx_status_t gate_monitor_start(void *zmq, void *router, struct gate_monitor **monitor_p);

/* Stops the thread and closes its sockets; NULL-safe. */
void gate_monitor_stop(struct gate_monitor *monitor);

/* The next event, without blocking; false when none waits. */
bool gate_monitor_next(struct gate_monitor *monitor, struct gate_event *event_p);

/* The socket the loop reads events from, for zmq_poll and readiness. */
void *gate_monitor_socket(struct gate_monitor *monitor);

/* The socket cookie `fd` holds now, 0 when it holds no socket: whether a descriptor still
 * holds the connection an event named. */
uint64_t gate_monitor_cookie(int fd);

#endif
