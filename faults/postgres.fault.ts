/** PostgreSQL restarted under load with `pg_ctl restart -m fast`. */
import { describeScenario } from './lib/scenario.ts'
import { useWorld } from './lib/world.ts'

const servers = useWorld()

describeScenario('PostgreSQL restarted (pg_ctl restart -m fast)', servers, {
  slug: 'postgres-restart',
  async fault({ postgres }) {
    const { downAt, upAt } = await postgres.restart()
    return { label: 'pg_ctl restart -m fast', restarted: 'PostgreSQL', upMeans: 'accepted connections', downAt, upAt }
  },
})
