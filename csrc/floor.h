/*
 * floor.h - measurement floors for the benchmarks, kept apart from the lock.
 *
 * The cheapest things a cross-process lock built on this binding could do:
 * one atomic read-modify-write on a shared word per call, and a raw futex
 * wait/broadcast.  bench/ and `pyshmlock bench` report pyshmlock against
 * these, measured in the same run.
 */
#ifndef PYSHMLOCK_FLOOR_H
#define PYSHMLOCK_FLOOR_H

#include <stdint.h>

/* One seq_cst fetch-add on *word; returns the previous value. */
uint32_t floor_fetch_add(uint32_t *word, uint32_t delta);
/* Sleep while *word == val (shared futex) until deadline_ns (CLOCK_MONOTONIC,
 * -1 forever).  Returns 0 woken/changed, 1 timed out, 3 interrupted. */
int floor_futex_wait(uint32_t *word, uint32_t val, int64_t deadline_ns);
/* Store val into *word and wake every sleeper on it. */
void floor_futex_store_wake_all(uint32_t *word, uint32_t val);

#endif
