/* gate_monitor.c: the thread that reads a listener's monitor events and names accepted
 * descriptors (gate_monitor.h). It owns ZeroMQ's monitor socket and one end of a PAIR pipe;
 * the loop owns the other end, reads events from it and sends "stop" on it. Nothing else is
 * shared, so there is no lock: ZeroMQ's pipe carries everything between the two threads. */
#include "gate_monitor.h"

#include "error.h"

#include <zmq.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57 /* Linux 4.19 and later; older glibc headers lack it */
#endif
#define GATE_MONITOR_ENDPOINT "inproc://kvx-gate-monitor"
#define GATE_PIPE_ENDPOINT    "inproc://kvx-gate-events"
/* Events the loop has not read yet; past this the thread waits, then ZeroMQ's monitor pipe
 * fills and its I/O thread waits, as before this thread (a loop stalled that long). */
#define GATE_PIPE_HWM 16384

struct gate_monitor {
    void *events;   /* ZeroMQ's monitor socket: the thread's */
    void *thread_end;
    void *loop_end;
    pthread_t thread;
    bool running;
};

static void *pair_open(void *zmq, int hwm)
{
    int linger   = 0;
    void *socket = zmq_socket(zmq, ZMQ_PAIR);

    if (socket != NULL && (zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
                           zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
                           zmq_setsockopt(socket, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0)) {
        zmq_close(socket);
        return NULL;
    }
    return socket;
}

uint64_t gate_monitor_cookie(int fd)
{
    uint64_t cookie  = 0;
    socklen_t length = sizeof(cookie);

    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &length) != 0)
        return 0;
    return cookie;
}

/* What `fd` holds now: its peer's IP address and its cookie, or "" and 0 once it is closed. */
static void accepted_name(int fd, struct gate_event *e)
{
    struct sockaddr_storage peer;
    socklen_t length = sizeof(peer);

    e->address[0] = '\0';
    e->cookie     = gate_monitor_cookie(fd);
    if (e->cookie == 0 || getpeername(fd, (struct sockaddr *)&peer, &length) != 0)
        return;
    if (peer.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, e->address,
                  sizeof(e->address));
    else if (peer.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, e->address,
                  sizeof(e->address));
}

/* One event from ZeroMQ's monitor: [event: 2 bytes, value: 4 bytes][endpoint]; false when
 * the frame is not one (the endpoint names the listener, never the peer: dropped). */
static bool event_read(void *events, struct gate_event *e)
{
    uint8_t head[6];
    int size = zmq_recv(events, head, sizeof(head), ZMQ_DONTWAIT);
    int more;
    size_t length = sizeof(more);

    while (zmq_getsockopt(events, ZMQ_RCVMORE, &more, &length) == 0 && more) {
        char skip[8];

        zmq_recv(events, skip, sizeof(skip), ZMQ_DONTWAIT);
    }
    if (size != (int)sizeof(head))
        return false;
    memset(e, 0, sizeof(*e));
    memcpy(&e->event, head, sizeof(e->event));
    memcpy(&e->value, head + 2, sizeof(e->value));
    if (e->event == ZMQ_EVENT_ACCEPTED)
        accepted_name((int)e->value, e);
    return true;
}

/* Passes `e` to the loop, waiting while its pipe is full; false when the loop said stop or
 * the context is ending. */
static bool event_forward(struct gate_monitor *m, const struct gate_event *e)
{
    for (;;) {
        zmq_pollitem_t item = {.socket = m->thread_end, .events = ZMQ_POLLIN | ZMQ_POLLOUT};
        int ret;

        if (zmq_send(m->thread_end, e, sizeof(*e), ZMQ_DONTWAIT) == (int)sizeof(*e))
            return true;
        if (zmq_errno() != EAGAIN)
            return false;
        ret = zmq_poll(&item, 1, -1);
        if ((ret < 0 && zmq_errno() != EINTR) || (ret > 0 && (item.revents & ZMQ_POLLIN)))
            return false;
    }
}

static void *monitor_run(void *arg)
{
    struct gate_monitor *m = arg;

    for (;;) {
        zmq_pollitem_t items[2] = {{.socket = m->events, .events = ZMQ_POLLIN},
                                   {.socket = m->thread_end, .events = ZMQ_POLLIN}};
        struct gate_event e;

        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break; /* the context is ending */
        }
        if (items[1].revents & ZMQ_POLLIN)
            break; /* "stop" */
        if ((items[0].revents & ZMQ_POLLIN) && event_read(m->events, &e) &&
            !event_forward(m, &e))
            break;
    }
    return NULL;
}

kvx_status_t gate_monitor_start(void *zmq, void *router, struct gate_monitor **monitor_p)
{
    const int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                       ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    struct gate_monitor *m = calloc(1, sizeof(*m));
    int ret;

    if (m == NULL)
        return error_no_memory("the gate's monitor");
    if (zmq_socket_monitor(router, GATE_MONITOR_ENDPOINT, events) != 0 ||
        (m->events = pair_open(zmq, 1000)) == NULL ||
        zmq_connect(m->events, GATE_MONITOR_ENDPOINT) != 0 ||
        (m->loop_end = pair_open(zmq, GATE_PIPE_HWM)) == NULL ||
        zmq_bind(m->loop_end, GATE_PIPE_ENDPOINT) != 0 ||
        (m->thread_end = pair_open(zmq, GATE_PIPE_HWM)) == NULL ||
        zmq_connect(m->thread_end, GATE_PIPE_ENDPOINT) != 0) {
        kvx_status_t status =
            error_set(KVX_ERR_INTERNAL, "gate: monitor: %s", zmq_strerror(zmq_errno()));

        gate_monitor_stop(m);
        return status;
    }
    /* the sockets move to the thread here: pthread_create orders what came before */
    ret = pthread_create(&m->thread, NULL, monitor_run, m);
    if (ret != 0) {
        gate_monitor_stop(m);
        return error_set(KVX_ERR_INTERNAL, "gate: monitor thread: %s", strerror(ret));
    }
    m->running = true;
    *monitor_p = m;
    return KVX_OK;
}

void gate_monitor_stop(struct gate_monitor *monitor)
{
    if (monitor == NULL)
        return;
    if (monitor->running) {
        zmq_send(monitor->loop_end, "stop", 4, 0); /* never blocks: the thread reads it */
        pthread_join(monitor->thread, NULL);
    }
    if (monitor->thread_end != NULL)
        zmq_close(monitor->thread_end);
    if (monitor->loop_end != NULL)
        zmq_close(monitor->loop_end);
    if (monitor->events != NULL)
        zmq_close(monitor->events);
    free(monitor);
}

bool gate_monitor_next(struct gate_monitor *monitor, struct gate_event *event_p)
{
    return zmq_recv(monitor->loop_end, event_p, sizeof(*event_p), ZMQ_DONTWAIT) ==
           (int)sizeof(*event_p);
}

void *gate_monitor_socket(struct gate_monitor *monitor)
{
    return monitor->loop_end;
}
