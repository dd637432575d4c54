/*
 * watcher.c - the asyncio watcher.
 *
 * One watcher per (process, lock) sleeps for every parked asyncio attempt of
 * that process, in a thread of its own that runs only C (it never takes the
 * GIL).  When a word a parked attempt waits on changes, it writes to one
 * eventfd per event loop; each loop watches its eventfd (add_reader) and
 * retries its parked attempts.  So a wake-up costs one futex wake of this
 * thread and one eventfd wake of the loop, and no Python runs in between.
 *
 * What is watched.  A parked attempt registers the value its try decided on
 * (shl_waiter.expect, on the state word or on drain_seq).  shl_watcher_park
 * refuses (SHL_AGAIN: retry now) if the word no longer holds that value.
 * Otherwise the attempt joins the current generation: the thread sleeps while
 * every word holds the value its parked attempts expect.  Two attempts of one
 * generation that expect different values of one word mean it changed in
 * between, so the thread wakes everybody at once.  Waking everybody (a
 * broadcast) starts a new generation; every woken attempt retries and parks
 * again with a fresh value.  A spurious broadcast is always safe.
 *
 * A new registration the sleeping thread does not cover yet bumps the
 * process-private kick word, which the thread sleeps on too, so a newly
 * parked attempt is watched at once whatever it waits on.
 *
 * Everything here is process-private: the mutex, the kick word, the fds.  A
 * forked child starts with no thread and never touches the parent's watcher.
 */
#include "internal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>

#define WATCHER_IDLE_NS (5000LL * 1000 * 1000)   /* thread exits after idling this long */

/* Which words the sleeping watcher thread covers (shl_watcher.cover). */
#define WATCH_STATE 1
#define WATCH_DRAIN 2

struct shl_watcher {
    shl_lock *h;
    pthread_mutex_t mu;            /* guards everything below except kick */
    _Atomic uint32_t kick;         /* bumped (release, and futex-woken) to re-read the
                                      spec; the thread loads it with acquire before it
                                      reads the spec under mu */
    uint64_t gen;                  /* generation of the current registrations */
    uint32_t n_state, n_drain;     /* parked attempts of this generation per word */
    uint32_t sexp, qexp;           /* the value they expect (state: sleeper bits ignored) */
    int sdirty, qdirty;            /* two different expectations: wake all */
    int32_t cover;                 /* WATCH_* the sleeping thread covers ... */
    uint32_t cover_s, cover_q;     /* ... and with which values */
    int running, have_tid, closing;
    pthread_t tid;
    int *fds;                      /* one eventfd per event loop */
    int nfds, capfds;
};

static void watcher_kick(shl_watcher *wt)
{
    /* Release: the thread re-reads the spec under mu anyway; the bump only
     * has to make its futex wait fail or end. */
    atomic_fetch_add_explicit(&wt->kick, 1, memory_order_release);
    futex_wake_all(&wt->kick);
}

/* Wake every event loop and start a new generation.  Caller holds mu. */
static void watcher_broadcast(shl_watcher *wt)
{
    uint64_t one = 1;
    wt->gen++;
    wt->n_state = wt->n_drain = 0;
    wt->sdirty = wt->qdirty = 0;
    for (int i = 0; i < wt->nfds; i++) {
        /* Only EAGAIN (the counter is saturated: already readable) can fail. */
        ssize_t r = write(wt->fds[i], &one, sizeof one);
        (void)r;
    }
}

static int state_differs(uint32_t a, uint32_t b)
{
    return ((a ^ b) & ~(ST_SLEEPERS | ST_DRAINERS)) != 0;
}

static void *watcher_main(void *arg)
{
    shl_watcher *wt = arg;
    shl_lock *h = wt->h;
    /* The thread is a call in flight on h for as long as it runs, so that
     * shl_close refuses (SHL_EINFLIGHT) instead of unmapping under it; the
     * binding stops the watcher (shl_watcher_free) before it closes. */
    int entered = enter(&h) == SHL_OK;
    struct shl_header *hd = entered ? h->hdr : NULL;
    int64_t idle_since = mono_ns();
    pthread_mutex_lock(&wt->mu);
    if (!entered)
        watcher_broadcast(wt);   /* closed: every parked task retries and sees it */
    while (entered && !wt->closing) {
        uint32_t k = atomic_load_explicit(&wt->kick, memory_order_acquire);
        if (wt->n_state == 0 && wt->n_drain == 0) {
            wt->cover = 0;
            int64_t now = mono_ns();
            if (now - idle_since >= WATCHER_IDLE_NS)
                break;
            pthread_mutex_unlock(&wt->mu);
            futex_wait_until(&wt->kick, k, idle_since + WATCHER_IDLE_NS);
            pthread_mutex_lock(&wt->mu);
            continue;
        }
        if (wt->sdirty || wt->qdirty || ensure_attached(h) != SHL_OK) {
            /* An attachment error reaches every task through its retry. */
            watcher_broadcast(wt);
            continue;
        }
        _Atomic uint32_t *words[3];
        uint32_t vals[3];
        int nwords = 0, changed = 0;
        if (wt->n_state) {
            uint32_t v = arm_sleepers(h, wt->sexp, &changed);
            words[nwords] = &hd->state;
            vals[nwords++] = v;
        }
        if (!changed && wt->n_drain) {
            /* The parked attempts armed DRAINERS themselves after reading
             * qexp; whoever clears the bit bumps the counter. */
            changed = atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != wt->qexp;
            words[nwords] = &hd->drain_seq;
            vals[nwords++] = wt->qexp;
        }
        if (changed) {
            watcher_broadcast(wt);
            continue;
        }
        wt->cover = (wt->n_state ? WATCH_STATE : 0) | (wt->n_drain ? WATCH_DRAIN : 0);
        wt->cover_s = wt->sexp;
        wt->cover_q = wt->qexp;
        words[nwords] = &wt->kick;
        vals[nwords++] = k;
        pthread_mutex_unlock(&wt->mu);
        int32_t watch[FUTEX_WAITV_MAX];
        int nwatch = collect_watch_set(h, watch, FUTEX_WAITV_MAX - nwords);
        int r = sleep_and_probe(h, words, vals, nwords, watch, nwatch, -1);
        pthread_mutex_lock(&wt->mu);
        wt->cover = 0;
        idle_since = mono_ns();
        if (atomic_load_explicit(&wt->kick, memory_order_acquire) != k || r == ETIMEDOUT) {
            /* Kicked or the safety net: wake all only if a word moved away
             * from what this generation expects (a futex wait compares the
             * same way); otherwise re-read the spec and sleep again. */
            int moved = 0;
            if (wt->n_state)
                moved |= state_differs(atomic_load_explicit(&hd->state, memory_order_seq_cst),
                                       wt->sexp);
            if (wt->n_drain)
                moved |= atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != wt->qexp;
            if (moved)
                watcher_broadcast(wt);
            continue;
        }
        /* Woken by a word or by a death (already probed and reclaimed):
         * every parked attempt retries, as a blocked thread would. */
        watcher_broadcast(wt);
    }
    wt->running = 0;
    wt->cover = 0;
    pthread_mutex_unlock(&wt->mu);
    if (entered)
        leave(h);
    return NULL;
}

shl_watcher *shl_watcher_new(shl_lock *h)
{
    if (h == NULL)
        return NULL;
    shl_watcher *wt = calloc(1, sizeof *wt);
    if (wt == NULL)
        return NULL;
    wt->h = h;
    pthread_mutex_init(&wt->mu, NULL);
    return wt;
}

/* Start the thread if it is not running.  Caller holds mu. */
static int watcher_start(shl_watcher *wt)
{
    if (wt->running)
        return SHL_OK;
    if (wt->have_tid) {
        /* It has left its loop (running == 0 was set under mu, and it takes
         * mu no more), so this join returns at once. */
        pthread_join(wt->tid, NULL);
        wt->have_tid = 0;
    }
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* The thread must never take a signal meant for the application. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&wt->tid, &attr, watcher_main, wt);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        errno = r;
        return SHL_ESYS;
    }
    wt->have_tid = 1;
    wt->running = 1;
    return SHL_OK;
}

int shl_watcher_park(shl_watcher *wt, const shl_waiter *w, uint64_t *gen)
{
    if (wt == NULL || wt->h == NULL)
        return SHL_ECLOSED;
    shl_lock *h = wt->h;
    int r = enter(&h);   /* the reads of the segment below are a call */
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    int kick = 0;
    pthread_mutex_lock(&wt->mu);
    if (wt->closing) {
        r = SHL_ECLOSED;
    } else if (w->on_drain) {
        /* seq_cst: ordered after the attempt's own arming of DRAINERS. */
        if (atomic_load_explicit(&hd->drain_seq, memory_order_seq_cst) != w->expect) {
            r = SHL_AGAIN;
        } else {
            if (wt->n_drain++ == 0)
                wt->qexp = w->expect;
            else if (wt->qexp != w->expect)
                wt->qdirty = 1;
            kick = !(wt->cover & WATCH_DRAIN) || wt->cover_q != wt->qexp || wt->qdirty;
        }
    } else {
        if (state_differs(atomic_load_explicit(&hd->state, memory_order_seq_cst), w->expect)) {
            r = SHL_AGAIN;
        } else {
            if (wt->n_state++ == 0)
                wt->sexp = w->expect;
            else if (state_differs(wt->sexp, w->expect))
                wt->sdirty = 1;
            kick = !(wt->cover & WATCH_STATE) || state_differs(wt->cover_s, wt->sexp) ||
                   wt->sdirty;
        }
    }
    if (r == SHL_OK) {
        *gen = wt->gen;
        r = watcher_start(wt);
        if (r != SHL_OK) {
            /* Undo the registration: the caller raises. */
            if (w->on_drain) wt->n_drain--; else wt->n_state--;
        }
    }
    pthread_mutex_unlock(&wt->mu);
    leave(h);
    if (r == SHL_OK && kick)
        watcher_kick(wt);
    return r;
}

void shl_watcher_unpark(shl_watcher *wt, const shl_waiter *w, uint64_t gen)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    /* A broadcast since the park already forgot this registration. */
    if (gen == wt->gen) {
        if (w->on_drain) {
            if (wt->n_drain && --wt->n_drain == 0)
                wt->qdirty = 0;     /* nobody left who expected another value */
        } else {
            if (wt->n_state && --wt->n_state == 0)
                wt->sdirty = 0;
        }
    }
    pthread_mutex_unlock(&wt->mu);
}

uint64_t shl_watcher_gen(shl_watcher *wt)
{
    if (wt == NULL)
        return 0;
    pthread_mutex_lock(&wt->mu);
    uint64_t g = wt->gen;
    pthread_mutex_unlock(&wt->mu);
    return g;
}

int shl_watcher_add_loop(shl_watcher *wt)
{
    if (wt == NULL)
        return SHL_ECLOSED;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return SHL_ESYS;
    pthread_mutex_lock(&wt->mu);
    if (wt->nfds == wt->capfds) {
        int cap = wt->capfds ? 2 * wt->capfds : 4;
        int *p = realloc(wt->fds, (size_t)cap * sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&wt->mu);
            close(fd);
            errno = ENOMEM;
            return SHL_ESYS;
        }
        wt->fds = p;
        wt->capfds = cap;
    }
    wt->fds[wt->nfds++] = fd;
    pthread_mutex_unlock(&wt->mu);
    return fd;
}

void shl_watcher_drop_loop(shl_watcher *wt, int fd)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    for (int i = 0; i < wt->nfds; i++) {
        if (wt->fds[i] == fd) {
            /* Under mu, where the thread writes: once this returns it never
             * writes to fd again, and the caller may close it. */
            wt->fds[i] = wt->fds[--wt->nfds];
            break;
        }
    }
    pthread_mutex_unlock(&wt->mu);
}

void shl_watcher_free(shl_watcher *wt)
{
    if (wt == NULL)
        return;
    pthread_mutex_lock(&wt->mu);
    wt->closing = 1;
    int join = wt->have_tid;
    pthread_mutex_unlock(&wt->mu);
    watcher_kick(wt);
    if (join)
        pthread_join(wt->tid, NULL);
    free(wt->fds);      /* the fds themselves are the caller's to close */
    pthread_mutex_destroy(&wt->mu);
    free(wt);
}
