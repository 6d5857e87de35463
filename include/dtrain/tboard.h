/* tboard.h — TensorBoard event files, written by our own code (no TensorFlow, no protobuf
 * library): scalars that `tensorboard --logdir RUN_DIR` shows.
 *
 * File: RUN_DIR/events.out.tfevents.<unix time>.<host>.<pid>.dtrain, a TFRecord stream:
 * each record is uint64 length (LE), uint32 masked CRC32C of the length, the bytes, uint32
 * masked CRC32C of the bytes (mask: ((c >> 15) | (c << 17)) + 0xa282ead8). Each record is
 * one serialized tensorflow.Event: wall_time (1, double), step (2, int64), file_version
 * (3, "brain.Event:2" in the first record) or summary (5) holding Summary.Value entries with
 * tag (1, string) and simple_value (2, float), or for text a tensor (8: dtype DT_STRING, a
 * scalar shape, string_val) with metadata (9) naming the "text" plugin. */
#ifndef DTRAIN_TBOARD_H
#define DTRAIN_TBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

typedef struct dt_tb dt_tb;

/* Creates the event file in run_dir and writes the file_version record. dt_tb_close
 * accepts NULL. */
dt_status dt_tb_open(dt_tb **out, const char *run_dir);
void dt_tb_close(dt_tb *tb);
const char *dt_tb_path(const dt_tb *tb);

/* Appends one scalar event (flushed, so a crash loses nothing already written). */
dt_status dt_tb_scalar(dt_tb *tb, const char *tag, long step, double value);

/* Appends one text summary (TensorBoard's Text tab: a scalar DT_STRING tensor with the "text"
 * plugin's metadata), e.g. the resolved config, shown as markdown. */
dt_status dt_tb_text(dt_tb *tb, const char *tag, long step, const char *text);

/* CRC32C (Castagnoli), as TFRecord uses it. */
uint32_t dt_crc32c(const void *data, size_t n);

#endif
