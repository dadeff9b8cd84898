/* zsocket.c: ZeroMQ socket helpers (zsocket.h). */
#include "zsocket.h"

int zsocket_fd(void *socket)
{
    int fd        = -1;
    size_t length = sizeof(fd);

    return zmq_getsockopt(socket, ZMQ_FD, &fd, &length) == 0 ? fd : -1;
}

bool zsocket_readable(void *socket)
{
    int events    = 0;
    size_t length = sizeof(events);

    return zmq_getsockopt(socket, ZMQ_EVENTS, &events, &length) == 0 && (events & ZMQ_POLLIN);
}

int zsocket_receive(void *socket, zmq_msg_t *frames, int max)
{
    int count = 0;

    for (bool more = true; more; count++) {
        zmq_msg_t extra;
        zmq_msg_t *msg = count < max ? &frames[count] : &extra;

        zmq_msg_init(msg);
        if (zmq_msg_recv(msg, socket, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(msg);
            break;
        }
        more = zmq_msg_more(msg);
        if (msg == &extra)
            zmq_msg_close(msg);
    }
    return count;
}

void zsocket_frames_close(zmq_msg_t *frames, int count, int max)
{
    for (int i = 0; i < count && i < max; i++)
        zmq_msg_close(&frames[i]);
}
