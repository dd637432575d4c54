/*
 * threads_tsan.c - the C core driven by many threads of one process, for
 * ThreadSanitizer (tests/test_thread_sanitizer.py builds it with
 * -fsanitize=thread and fails on any report).
 *
 * The protocol between processes is the model's (verify/shmlock.pml); what
 * threads of one process add is process-private: the handle's fields (its
 * slot, fork generation, hold counts, in-flight word), the keeper's and the
 * watchdog's requests, the handle table, the one-time platform and mutex
 * checks.  Every thread here starts at once and uses the core at the same
 * moments: observers (first calls of the one-time checks), openers (each
 * takes a slot of its own: attach, liveness lock, keeper), holds and waits
 * on one shared handle (any thread may release what another took), pauses
 * and resumes, probes (info), and closes.  A data race in any of it is a
 * TSan report.
 *
 *     cc -fsanitize=thread -g -O1 -Icsrc -Icsrc/core csrc/core/(*.c) \
 *        verify/threads_tsan.c -o build/threads_tsan -lpthread
 *     build/threads_tsan NAME
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmlock.h"

#define THREADS 6
#define ROUNDS  200

static const char *g_name;
static shl_lock *g_shared;             /* one handle, used by every thread */
static pthread_barrier_t g_start, g_opened;
static _Atomic int g_failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "threads_tsan: %s\n", what);
        atomic_fetch_add(&g_failures, 1);
    }
}

/* One try, withdrawn if it would wait (a call with timeout 0). */
static int try_once(shl_lock *h, int kind, uint32_t flags)
{
    shl_waiter w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    w.flags = flags;
    int r = shl_try(h, &w);
    if (r == SHL_AGAIN) {
        shl_wait(h, &w, 0);     /* deadline passed: a sleep of nothing, then cancel */
        shl_cancel(h, &w);
    }
    return r;
}

static void observe(void)
{
    shl_observer *o;
    if (shl_observe_open(g_name, &o, NULL) != SHL_OK)
        return;
    shl_snapshot snap;
    shl_slot_snapshot slot;
    if (shl_observe_info(o, &snap) == SHL_OK)
        for (uint32_t i = 0; i < 8 && i < snap.max_processes; i++)
            shl_observe_slot(o, i, &slot);
    shl_observe_close(o);
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    pthread_barrier_wait(&g_start);
    /* The process's first calls into the core, made by every thread at
     * once: the one-time checks (the platform, the slot mutexes' kind). */
    observe();
    shl_lock *own = NULL;
    shl_open_info info;
    check(shl_open(g_name, SHL_OPEN_CREATE, 0600, -1, 64, &own, &info) == SHL_OK, "open");
    if (id == 0)
        check(shl_open(g_name, SHL_OPEN_CREATE, 0600, -1, 64, &g_shared, &info) == SHL_OK,
              "open shared");
    pthread_barrier_wait(&g_opened);
    for (int k = 0; k < ROUNDS; k++) {
        /* Holds on the shared handle: any thread may release. */
        if (try_once(g_shared, SHL_KIND_READ, 0) == SHL_OK)
            check(shl_release_read(g_shared) == SHL_OK, "release_read");
        if ((k + id) % 7 == 0 && try_once(g_shared, SHL_KIND_WRITE, 0) == SHL_OK)
            check(shl_release_write(g_shared) == SHL_OK, "release_write");
        /* Its own handle (its own slot): probes, the gate. */
        if (own) {
            shl_snapshot snap;
            shl_slot_snapshot slot;
            shl_info(own, &snap);
            shl_slot_info(own, (uint32_t)(k % 8), &slot);
            if (k % 11 == id) {
                shl_pause(own);
                try_once(own, SHL_KIND_RESUME, SHL_RESUME_FORCE);
            }
            if (try_once(own, SHL_KIND_READ, 0) == SHL_OK)
                check(shl_release_read(own) == SHL_OK, "release_read own");
        }
        if (k % 50 == id)
            observe();
    }
    if (own)
        check(shl_close(own) == SHL_OK, "close");
    return NULL;
}

/* NAME must exist already, with another process attached: the threads'
 * first calls are then observers' that look at its slot, at once. */
int main(int argc, char **argv)
{
    g_name = argc > 1 ? argv[1] : "threads-tsan";
    pthread_t t[THREADS];
    pthread_barrier_init(&g_start, NULL, THREADS);
    pthread_barrier_init(&g_opened, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    if (g_shared == NULL)
        return 2;
    try_once(g_shared, SHL_KIND_RESUME, SHL_RESUME_FORCE);
    check(shl_close(g_shared) == SHL_OK, "close shared");
    uint32_t attached;
    shl_unlink(g_name, 1, &attached);
    return atomic_load(&g_failures) ? 1 : 0;
}
