"""Ablation behind reports/benchmarks/layer_additivity.md (notes): the trial per-model cost model of commit 9a8064b
(last-layer corner, third decode context), with and without each addition, on the same measured runs. Runs
against that commit only (`git worktree add /tmp/t 9a8064b`, then from /tmp/t:
`python reports/benchmarks/layer_additivity/ablate_9a8064b.py reports/benchmarks/energy_transfer_data/h100_raw12.json ...`)."""
import json,copy,sys
sys.path.insert(0,'benchmarks')
import energy_transfer as et
from advisor.energy.model_costmodel import ModelProfileCostModel
from advisor.energy.reference_shapes import REFERENCE_SHAPES
from energy_transfer_collect import plan_formats
from advisor.plan import Plan
def variant(p, corner, mid):
    p=copy.deepcopy(p)
    if not corner:
        for ph in ('decode','prefill'): p[ph].pop('last_fp8',None)
    if not mid and '640' in map(str,p['decode']['contexts']):
        d=p['decode']; i=[str(c) for c in d['contexts']].index('640')
        d['contexts']=[c for c in d['contexts'] if str(c)!='640']; d['energy_contexts']=d['contexts']
        def drop(t):
            if isinstance(t,dict):
                t.pop('640',None)
        for k in ('step_ms','j_per_step'):
            for v in d[k].values(): drop(v)
            if 'last_fp8' in d: drop(d['last_fp8'][k])
    return p
for f in sys.argv[1:]:
    d=json.load(open(f))
    for name,v in d['shapes'].items():
        shape=REFERENCE_SHAPES[name].shape(v['num_layers'])
        plans={k:Plan(x) for k,x in plan_formats(v['num_layers']).items()}
        out=[]
        for corner in (True,False):
            for mid in (True,False):
                m=ModelProfileCostModel(variant(v['profile'],corner,mid),shape)
                errs=[et.predict(m,plans[r['plan']],r)/r['measured_j_per_token']-1 for r in v['rows']]
                dec=[e for e,r in zip(errs,v['rows']) if r['phase']=='decode']
                mixed=[e for e,r in zip(errs,v['rows']) if r['plan'] in('mlp-fp8','middle-fp8')]
                out.append(f"corner={int(corner)} ctx640={int(mid)}: max {100*max(map(abs,errs)):.1f}% decode {100*max(map(abs,dec)):.1f}% mixed {100*max(map(abs,mixed)):.1f}% mean|e| {100*sum(map(abs,errs))/len(errs):.2f}%")
        print(f.split('/')[-1],name); [print('   ',o) for o in out]
