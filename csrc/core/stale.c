/*
 * stale.c - resetting a pause left behind by processes that are all gone
 * (`stale="reset"`, pyshmlock/stale.py decides when to ask).  The reset is
 * one CAS that clears PAUSED, made only when no other process is attached
 * alive, the pause is the one the caller judged stale, no update or update
 * session pins it (invariant 4) and no host lease is armed.  It also clears
 * the data-suspect mark: the processes that held the data are all gone.
 */
#include "internal.h"

/* How often the reset re-scans after the state word changed under it before
 * it gives up (and keeps the pause): a word that keeps changing means live
 * processes are using the lock, so it is not stale. */
#define STALE_RETRIES 16

static int do_reset_stale(shl_lock *h, uint32_t dead_pauser)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    for (int attempt = 0; attempt < STALE_RETRIES; attempt++) {
        /* seq_cst: the word is read before the scan below; the CAS at the end
         * compares against exactly this value. */
        uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
        if (!(s & ST_PAUSED))
            return 0;
        int32_t o = owner_index(h, s);
        if (o == -2)
            return SHL_ECORRUPT;
        /* An update claim pins the pause (invariant 4).  The scan below
         * skips our own slot, so our own update claim is checked here. */
        if (o == self_slot(h) && (s & ST_UPDATE))
            return 0;
        /* An update session pins the pause until its end or expiry, whoever
         * is left: it is owned by a token, not by a process. */
        if (s & ST_PINNED)
            return 0;
        /* Only the pause the caller judged stale is cleared: a pause recorded
         * under another pid (or none yet: a pause() between its CAS and its
         * pid store) is a fresh one. */
        if (atomic_load_explicit(&hd->paused_by_pid, memory_order_relaxed) != dead_pauser ||
            dead_pauser == 0)
            return 0;
        /* A segment with a host lease armed is under its cluster agent's
         * control: a restarted host stays paused (fail closed) until its
         * agent has mirrored the cluster, whoever paused it and whoever
         * died.  relaxed: an agent that arms the lease later is attached
         * and alive (the scan below sees it), and if a reset still wins a
         * race with it, an expired lease is paused again by the watchdog. */
        if (atomic_load_explicit(&hd->lease_deadline_ns, memory_order_relaxed) != 0)
            return 0;
        /* Any other live process: not stale.  Probing reclaims dead slots
         * (their reads, owed registrations and claims), which changes the
         * word and so makes the CAS below fail once and the loop rescan. */
        for (uint32_t i = 0; i < h->max; i++)
            if ((int32_t)i != self_slot(h) && probe_slot(h, i) != PROBE_DEAD)
                return 0;
        /* An update claim pins the pause; a live claimant was seen above, a
         * dead one was reclaimed (and changed the word). */
        /* Every process that used the lock is gone, and so is whatever
         * half-written state it kept in memory: the restarted service
         * starts from its own data, not from a suspect one.  (Data that
         * outlives the processes needs stale="keep".)  Cleared by the CAS
         * that opens the gate, so a mark made after it stays. */
        uint32_t ns = s & ~(ST_PAUSED | ST_SLEEPERS | ST_SUSPECT);
        if (atomic_compare_exchange_strong_explicit(&hd->state, &s, ns, memory_order_seq_cst,
                                                    memory_order_seq_cst)) {
            atomic_store_explicit(&hd->paused_by_pid, 0, memory_order_relaxed);
            record_recovery(h, dead_pauser, SHL_LOST_PAUSE, 0, 0);
            /* A process that attached after our scan may already sleep for
             * the resume: it set SLEEPERS, which would have failed our CAS,
             * so only a sleeper bit we saw can be pending; wake it anyway. */
            if (s & ST_SLEEPERS)
                futex_wake_all(&hd->state);
            return 1;
        }
    }
    return 0;
}

int shl_reset_stale(shl_lock *h, uint32_t dead_pauser)
{
    RUN_IN_FLIGHT(h, do_reset_stale(h, dead_pauser));
}
