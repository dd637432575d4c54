/*
 * wait.c - sleeping.  A waiter sleeps on the word its attempt decided on
 * (the state word, or the drain counter while a claim waits for readers)
 * and, through futex_waitv, on the robust-mutex words of the processes it
 * may be waiting for, so a keeper's death wakes it at once; it then probes
 * the slot (slots.c), which reclaims it once the whole process is gone and
 * wakes everyone else.  A process whose keeper is gone but which still runs
 * ("exiting": the rest of a dying process, or a keeper that exited alone)
 * rings no doorbell when it is finally gone, so a waiter that watches one
 * re-probes it on a short timer that doubles (EXITING_POLL_NS, up to the
 * safety net).  The loop of
 * an attempt (try, sleep, try again, withdraw) is not here: it is the
 * binding's, written once (csrc/fastpath/attempt.c), over shl_try,
 * shl_wait and shl_cancel.
 *
 * A waiter sets SLEEPERS (arm_sleepers) or DRAINERS (protocol.c) before it
 * sleeps, and whoever changes a condition a sleeper may wait for clears the
 * bit and wakes all; the futex compares the value the decision was made on,
 * so a change in between makes the sleep return at once.  Sleeps are capped
 * by a safety net (SAFETY_NET_NS) that re-probes: a process that attached
 * after the watch set was taken is noticed within it.
 */
#include "internal.h"

/* Set for good the first time futex_waitv (Linux 5.16) turns out missing
 * although the platform check found it (a seccomp filter, say). */
static _Atomic int g_waitv_failed;   /* relaxed: a hint; a stale 0 costs one ENOSYS */

static int have_waitv(void)
{
    return (core_platform() & SHL_PLATFORM_WAITV) &&
           !atomic_load_explicit(&g_waitv_failed, memory_order_relaxed);
}

/* The first re-probe of an exiting process comes after this long; each
 * sleep of the same thread that still finds one doubles it, up to the
 * safety net.  The rest of a process in a group exit is normally gone
 * within tens of microseconds of its keeper (a few first polls); a keeper
 * that exited alone costs the waiters one wake-up per safety net. */
#define EXITING_POLL_NS (50LL * 1000)
static __thread uint32_t t_exiting_polls;

#ifdef __GLIBC__
/* Fill v with a watch on slot i's keeper.  Returns 0 if armed, 1 if no
 * live keeper holds the mutex (probe instead of sleeping on it), 2 if the
 * slot's mutex is not one of ours (skip it). */
static int arm_death_watch(shl_lock *h, uint32_t i, struct futex_waitv *v)
{
    if (!slot_mutex_sane(&h->slots[i].owner))
        return 2;   /* corrupt: watch nothing there (probing skips it too) */
    /* The kernel's robust-futex ABI puts the owner's TID in this word and
     * sets FUTEX_OWNER_DIED when the owner dies, waking one waiter if
     * FUTEX_WAITERS is set.  We set that bit so a death wakes us. */
    uint32_t *word = mutex_word(&h->slots[i].owner);
    /* acquire: a word seen OWNER_DIED or free orders the dead keeper's (or
     * the closer's) last writes to the slot before our probe of it. */
    uint32_t cur = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if ((cur & FUTEX_TID_MASK) == 0 || (cur & FUTEX_OWNER_DIED))   /* [model:DEATH_WATCH] */
        return 1;
    if (!(cur & FUTEX_WAITERS)) {
        uint32_t want = cur | FUTEX_WAITERS;
        if (!__atomic_compare_exchange_n(word, &cur, want, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;   /* changed under us: just probe */
        cur = want;
    }
    v->val = cur;
    v->uaddr = (uintptr_t)word;
    v->flags = FUTEX_32;
    v->__reserved = 0;
    return 0;
}
#endif

/* Does a live keeper hold slot i's mutex (as its word says)?  Without glibc
 * the word cannot be read: say yes (the probes on the timer decide). */
static int keeper_holds(shl_lock *h, uint32_t i)
{
#ifdef __GLIBC__
    if (!slot_mutex_sane(&h->slots[i].owner))
        return 1;
    /* acquire, as in arm_death_watch */
    uint32_t cur = __atomic_load_n(mutex_word(&h->slots[i].owner), __ATOMIC_ACQUIRE);
    return (cur & FUTEX_TID_MASK) != 0 && !(cur & FUTEX_OWNER_DIED);
#else
    (void)h; (void)i;
    return 1;
#endif
}


/*
 * A sleeper watches every other attached process, not only the one it waits
 * for: any process may die between changing a word and its FUTEX_WAKE (a
 * releaser after its CAS, a reader after its last decrement), and then the
 * kernel's OWNER_DIED wake-up on that process's mutex is the only wake-up
 * left.  The woken watcher reclaims the slot, and reclaiming always wakes
 * everyone (recover_slot).  Up to FUTEX_WAITV_MAX - 2 processes are watched;
 * beyond that the safety net covers the rest.
 */
int collect_watch_set(shl_lock *h, int32_t *watch, int cap)
{
    int n = 0;
    /* The slot the state word names as exclusive owner comes first, free
     * or not, so the cap never drops it.  A claim or hold naming a free
     * slot (its owner detached, or a corrupt word) is then probed at once
     * (its mutex word has no owner) and reclaimed by probe_slot: no claim
     * can name a slot that nobody watches. */
    int32_t self = self_slot(h);
    int32_t o = owner_index(h, atomic_load_explicit(&h->hdr->state, memory_order_seq_cst)); /* [model:WATCH_OWNER] */
    if (o >= 0 && o != self && n < cap)
        watch[n++] = o;
    /* Slots at or above the high-water mark were never attached, so they
     * have no owner to watch and no leftovers (a process that attaches
     * after this scan is missed either way, as without the bound: the
     * safety net covers it).  The owner slot above is watched whatever the
     * mark says. */
    uint32_t lim = scan_limit(h);
    for (uint32_t i = 0; i < lim && n < cap; i++)
        if ((int32_t)i != self && (int32_t)i != o &&
            (atomic_load_explicit(&h->slots[i].pid, memory_order_relaxed) != 0 ||
             !slot_is_clean(&h->slots[i])))
            watch[n++] = (int32_t)i;
    return n;
}

/*
 * One futex_waitv sleep on the words and the watched processes' mutex
 * words (glibc only: the death watch needs the mutex word).  Returns the
 * outcome (0 or EINTR, or ETIMEDOUT with *probe set for the safety net) or
 * -1 when futex_waitv is not there (then g_have_waitv is cleared and the
 * caller sleeps without it).
 */
static int sleep_waitv(shl_lock *h, _Atomic uint32_t *const *words, const uint32_t *vals,
                       int nwords, const int32_t *watch, int nwatch, int64_t until, int *probe)
{
#ifdef __GLIBC__
    struct futex_waitv v[FUTEX_WAITV_MAX];
    int n = 0, gone = 0;   /* gone: a keeper died since the pre-pass looked */
    for (int k = 0; k < nwords; k++) {
        v[n].val = vals[k];
        v[n].uaddr = (uintptr_t)words[k];
        v[n].flags = FUTEX_32;
        v[n].__reserved = 0;
        n++;
    }
    for (int k = 0; k < nwatch && !gone && n < FUTEX_WAITV_MAX; k++) {
        int a = arm_death_watch(h, (uint32_t)watch[k], &v[n]);
        if (a == 0)
            n++;
        gone = a == 1;
    }
    if (gone) {
        *probe = 1;
        return 0;
    }
    struct timespec ts;
    ns_to_timespec(until, &ts);
    long rc = syscall(SYS_futex_waitv, v, (unsigned)n, 0, &ts, CLOCK_MONOTONIC); /* [model:FUTEX_WAIT] */
    if (rc >= 0) {
        *probe = rc >= nwords;   /* a death word, not one of ours */
        return 0;
    }
    if (errno == ENOSYS) {
        atomic_store_explicit(&g_waitv_failed, 1, memory_order_relaxed);
        return -1;
    }
    if (errno == EAGAIN)
        return 0;                /* a value had already changed */
    if (errno == EINTR)
        return EINTR;
    *probe = 1;                  /* ETIMEDOUT: the safety net */
    return ETIMEDOUT;
#else
    (void)h; (void)words; (void)vals; (void)nwords; (void)watch; (void)nwatch;
    (void)until; (void)probe;
    atomic_store_explicit(&g_waitv_failed, 1, memory_order_relaxed);
    return -1;
#endif
}

/*
 * Sleep while each words[k] still holds vals[k] and every watched process
 * lives, until deadline (-1: forever; capped by the safety net).  A watched
 * slot whose keeper is gone is probed first: reclaimed (something changed:
 * return at once), or exiting (not slept on: the sleep is capped by the
 * exiting poll instead).  Probes the watched processes when one of them
 * changed or the sleep timed out, so a dead one is reclaimed (which changes
 * the words and wakes everyone else).  Returns 0 (something may have
 * changed), ETIMEDOUT (safety net, exiting poll or deadline, nothing seen)
 * or EINTR.
 */
int sleep_and_probe(shl_lock *h, _Atomic uint32_t *const *words, const uint32_t *vals,
                    int nwords, const int32_t *watch, int nwatch, int64_t deadline_ns)
{
    int waitv = have_waitv();
    /* [model:SAFETY_NET] every sleep ends by this time, and the caller's
     * retry takes a fresh watch set: a process that attached after this
     * watch set was taken, and died, is otherwise noticed by nobody here. */
    int64_t until = mono_ns() + (waitv ? SAFETY_NET_NS : NO_WAITV_PROBE_NS);
    /* The keepers that are gone, before sleeping: a dead process is
     * reclaimed now; an exiting one is left out of the watch (its mutex
     * word rings no more) and re-probed on the exiting poll. */
    int32_t live[FUTEX_WAITV_MAX];
    int nlive = 0, exiting = 0;
    for (int k = 0; k < nwatch; k++) {
        if (keeper_holds(h, (uint32_t)watch[k])) {
            live[nlive++] = watch[k];
            continue;
        }
        int p = probe_slot(h, (uint32_t)watch[k]);   /* [model:PROBE_EXITING] */
        if (p == PROBE_DEAD) {
            t_exiting_polls = 0;
            return 0;           /* reclaimed (or free): the caller looks again */
        }
        if (p == PROBE_EXITING)
            exiting = 1;
        else
            live[nlive++] = watch[k];   /* taken again meanwhile: watch it */
    }
    if (exiting) {
        uint32_t n = t_exiting_polls < 16 ? t_exiting_polls : 16;
        int64_t poll = EXITING_POLL_NS << n;
        t_exiting_polls++;
        if (poll < until - mono_ns())
            until = mono_ns() + poll;
    } else {
        t_exiting_polls = 0;
    }
    if (deadline_ns >= 0 && deadline_ns < until)
        until = deadline_ns;
    /* An operator's handle (no slot) sleeps uncounted. */
    int32_t self = self_slot(h);
    struct shl_slot *me = self >= 0 ? &h->slots[self] : NULL;
    if (me)
        atomic_fetch_add_explicit(&me->waiting, 1, memory_order_relaxed);
    int probe = 0;
    int outcome = -1;
    if (waitv)
        outcome = sleep_waitv(h, words, vals, nwords, live, nlive, until, &probe);
    if (outcome < 0) {
        /* Without futex_waitv: sleep on the first word only, probing often. */
        int64_t cap = mono_ns() + NO_WAITV_PROBE_NS;
        outcome = futex_wait_until(words[0], vals[0], until < cap ? until : cap);
        probe = outcome == ETIMEDOUT;
    }
    if (me)
        atomic_fetch_sub_explicit(&me->waiting, 1, memory_order_relaxed);
    /* After a death wake-up or a timeout: every watched slot, the exiting
     * ones too (gone by now, perhaps).  A slot without a keeper that probes
     * dead was reclaimed now, which changed the words: say so, even if the
     * sleep itself timed out (the asyncio watcher then wakes its loops). */
    if (probe)
        for (int k = 0; k < nwatch; k++) {
            int keeperless = !keeper_holds(h, (uint32_t)watch[k]);
            if (probe_slot(h, (uint32_t)watch[k]) == PROBE_DEAD && keeperless &&
                outcome == ETIMEDOUT)
                outcome = 0;
        }
    return outcome;
}

/* Set SLEEPERS on the state word if it still holds the value `val` the
 * waiter decided on, ignoring the two sleeper bits (no condition depends on
 * them: a writer arming DRAINERS must not send every sleeping reader round
 * its loop).  Returns the armed value to sleep on, or sets *changed. */
uint32_t arm_sleepers(shl_lock *h, uint32_t val, int *changed)
{
    const uint32_t bits = ST_SLEEPERS | ST_DRAINERS;
    uint32_t cur = atomic_load_explicit(&h->hdr->state, memory_order_seq_cst);
    *changed = 0;
    for (;;) {
        if ((cur ^ val) & ~bits) {
            *changed = 1;
            return cur;
        }
        if (cur & ST_SLEEPERS)
            return cur;
        if (atomic_compare_exchange_weak_explicit(&h->hdr->state, &cur, cur | ST_SLEEPERS,
                                                  memory_order_seq_cst,
                                                  memory_order_seq_cst)) /* [model:WAIT_ARM_SLEEPERS] */
            return cur | ST_SLEEPERS;
    }
}

static int do_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    if (deadline_ns >= 0 && mono_ns() >= deadline_ns)
        return SHL_TIMEDOUT;

    _Atomic uint32_t *word;
    uint32_t val = w->expect;
    int32_t watch[FUTEX_WAITV_MAX];
    int nwatch = 0;
    if (!w->on_drain) {
        int changed;
        word = &hd->state;
        val = arm_sleepers(h, val, &changed);
        if (changed)
            return SHL_OK;
    } else {
        word = &hd->drain_seq;
    }
    nwatch = collect_watch_set(h, watch, FUTEX_WAITV_MAX - 1);
    if (sleep_and_probe(h, &word, &val, 1, watch, nwatch, deadline_ns) == EINTR)
        return SHL_EINTR;
    if (deadline_ns >= 0 && mono_ns() >= deadline_ns)
        return SHL_TIMEDOUT;
    return SHL_OK;
}

int shl_wait(shl_lock *h, shl_waiter *w, int64_t deadline_ns)
{
    RUN_IN_FLIGHT(h, do_wait(h, w, deadline_ns));
}
