/* zsocket.h: what every ZeroMQ socket of kvx needs, below the side channel and its gate: the
 * descriptor to sleep on, whether a message waits, and receiving one message frame by frame
 * without blocking and without keeping more frames than asked. */
#ifndef KVX_SRC_ZSOCKET_H
#define KVX_SRC_ZSOCKET_H

#include <zmq.h>

#include <stdbool.h>

int zsocket_fd(void *socket);

/* ZMQ_FD only signals that something changed: whether a message waits is ZMQ_EVENTS. */
bool zsocket_readable(void *socket);

/* Receives the frames of one waiting message into `frames` (the first `max` kept, the rest
 * read and dropped); returns how many were received in all, 0 when none waited. */
int zsocket_receive(void *socket, zmq_msg_t *frames, int max);

/* Closes the frames zsocket_receive kept of `count` received. */
void zsocket_frames_close(zmq_msg_t *frames, int count, int max);

#endif
