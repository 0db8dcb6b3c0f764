// A page's own refreshing (the Hardware and Work pages): one load at a time, the next one
// `seconds` after the last ended, and at once on request (after the load in flight, if any).

/**
 * Start refreshing: `load(isStopped)` runs now and again until `stop()`; `soon()` runs it again
 * at once. `load` handles its own errors (it says them on the page).
 */
export function startRefreshing(seconds, load) {
  let timer = null;
  let stopped = false;
  let inFlight = false;
  let again = false;
  const isStopped = () => stopped;

  async function run() {
    if (stopped) return;
    if (inFlight) {
      again = true;
      return;
    }
    if (timer !== null) clearTimeout(timer);
    timer = null;
    inFlight = true;
    try {
      await load(isStopped);
    } finally {
      inFlight = false;
    }
    if (stopped) return;
    if (again) {
      again = false;
      run();
    } else {
      timer = setTimeout(run, seconds * 1000);
    }
  }

  run();
  return {
    soon: run,
    stop() {
      stopped = true;
      if (timer !== null) clearTimeout(timer);
    },
  };
}
