/** Service processes killed under load with SIGKILL and started again: the workers process, then an API process. */
import { describeScenario } from './lib/scenario.ts'
import { useWorld } from './lib/world.ts'

const servers = useWorld()

describeScenario('the workers process killed and started again', servers, {
  slug: 'workers-killed',
  async fault(_world, deployment) {
    const { downAt, upAt } = await deployment.killAndRestart('workers', 1000)
    return {
      label: 'workers process killed with SIGKILL, a new one started 1 s later',
      restarted: 'the workers process',
      upMeans: 'logged that it started',
      downAt,
      upAt,
    }
  },
})

describeScenario('an API process killed and started again', servers, {
  slug: 'api-killed',
  async fault(_world, deployment) {
    const { downAt, upAt } = await deployment.killAndRestart('api-1', 1000)
    return {
      label: 'api-1 killed with SIGKILL, a new one started on its port 1 s later',
      restarted: 'api-1',
      upMeans: 'accepted connections',
      downAt,
      upAt,
      api: 0,
    }
  },
})
